//! Wake-ups across processes: work committed by one engine starts at once
//! on another engine's idle claim loops, and every commit that writes
//! events tells the relays (`flotilla_store::wake`).

use std::sync::Arc;
use std::time::Duration;

use flotilla_store::RunStatus;
use flotilla_store::wake::Channel;
use flotilla_worker::engine::{Engine, EngineSettings, SystemClock};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use crate::support::{Calls, echo_targets, eventually, row, settings, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// Whether a session of this database is listening on `channel`.
async fn listening(pool: &PgPool, channel: Channel) -> bool {
    sqlx::query_scalar(
        "SELECT count(*) > 0 FROM pg_stat_activity
         WHERE datname = current_database() AND query ILIKE 'LISTEN%' AND query LIKE '%' || $1 || '%'",
    )
    .bind(channel.name())
    .fetch_one(pool)
    .await
    .unwrap()
}

/// An engine of echo targets on which `workflow` (three steps) is stored.
async fn echo_engine(
    pool: &PgPool,
    calls: &Calls,
    settings: EngineSettings,
    workflow: &str,
) -> Engine {
    crate::support::echo_engine(pool, calls, Arc::new(SystemClock), settings, workflow).await
}

/// Engine B's one claim loop polls once an hour, so once it has looked
/// (at its start, and again when its listener came up) it only starts on
/// a job submitted through engine A, which runs no loops, if A's commit
/// wakes it.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_submitted_through_another_process_starts_at_once_on_idle_loops(pool: PgPool) {
    let calls = Calls::default();
    let submitter = echo_engine(&pool, &calls, settings("a"), "woken").await;
    let mut idle = settings("b");
    idle.claim_loops = 1;
    idle.idle_poll_min = Duration::from_secs(3600);
    idle.idle_poll_max = Duration::from_secs(3600);
    let runner = Engine::new(
        pool.clone(),
        echo_targets(&calls),
        Arc::new(SystemClock),
        idle,
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let (runner, stop) = (runner.clone(), stop.clone());
        async move { runner.run(stop, Duration::from_secs(5)).await }
    });
    eventually(
        Duration::from_secs(10),
        "B's loop looked twice and listens",
        || async { runner.claim_statements() >= 2 && listening(&pool, Channel::Runs).await },
    )
    .await;

    let job_id = submit(&submitter, "woken", json!({"n": 1})).await;
    eventually(
        Duration::from_secs(10),
        "the job completed on B",
        || async { row(&pool, job_id).await.status == RunStatus::Completed },
    )
    .await;
    assert_eq!(calls.of(job_id).len(), 3);
    stop.cancel();
    running.await.unwrap();
}

/// Waits for one notification, at most 10 s.
async fn heard(listener: &mut PgListener) {
    tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("no ring within 10 s")
        .unwrap();
}

/// The relays hear of a submission's ACCEPTED event and of every shared
/// commit of checkpoints and completions.
#[sqlx::test(migrator = "MIGRATOR")]
async fn commits_that_write_events_ring_the_outbox_channel(pool: PgPool) {
    let calls = Calls::default();
    let engine = echo_engine(&pool, &calls, settings("w"), "rung").await;
    let mut relay_side = PgListener::connect_with(&pool).await.unwrap();
    relay_side.listen(Channel::Outbox.name()).await.unwrap();
    submit(&engine, "rung", json!({"n": 1})).await;
    heard(&mut relay_side).await;

    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let (engine, stop) = (engine.clone(), stop.clone());
        async move { engine.run(stop, Duration::from_secs(5)).await }
    });
    // The submission's ring is heard; each step's commit rings again.
    heard(&mut relay_side).await;
    stop.cancel();
    running.await.unwrap();
}
