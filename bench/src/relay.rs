//! The relay alone: events per second draining a backlog of unpublished rows to
//! librdkafka's mock cluster (in memory, in this process), with and without
//! a long published history in the same table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use flotilla_contracts::{EventHeader, WorkflowRunEvent};
use flotilla_relay::{Relay, RelaySettings};
use flotilla_store::SystemClock;
use flotilla_tests::scratch::ScratchDatabase;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::report::Report;

/// Events each job of the backlog has (ACCEPTED, three checkpoints, COMPLETED).
const EVENTS_PER_JOB: i64 = 5;

/// A stored event as the workers write it, as JSON, for SQL to copy.
fn template() -> anyhow::Result<serde_json::Value> {
    let header = EventHeader {
        event_id: Uuid::new_v4(),
        job_id: Uuid::new_v4(),
        sequence: 2,
        workflow_name: "bench".into(),
        attempt: 1,
        occurred_at: Utc::now(),
    };
    // As a worker of this release keeps it: the row's columns hold the rest.
    Ok(flotilla_store::outbox::stored::compact(
        &WorkflowRunEvent::step_checkpoint(header, "step", None)?,
    )?)
}

/// Inserts `jobs × 5` rows, jobs interleaved as concurrent jobs write
/// them (every job's first event, then every job's second…); published
/// ones are behind every bucket's progress.
async fn insert_rows(pool: &PgPool, jobs: i64, published: bool) -> anyhow::Result<()> {
    let template = template()?;
    // In chunks, so a million rows do not make one huge transaction.
    let chunk = 20_000;
    let mut done = 0;
    while done < jobs {
        let count = chunk.min(jobs - done);
        sqlx::query(
            "WITH job AS (SELECT gen_random_uuid() AS job_id, n FROM generate_series(1, $1) n),
                  row AS (SELECT job.job_id, s.sequence, gen_random_uuid() AS event_id
                          FROM generate_series(1, $2) AS s(sequence), job
                          ORDER BY s.sequence, job.n)
             INSERT INTO workflow_run_outbox (event_id, job_id, sequence, event_type, body)
             SELECT event_id, job_id, sequence, 'STEP_CHECKPOINT', $3::jsonb FROM row",
        )
        .bind(count)
        .bind(EVENTS_PER_JOB)
        .bind(&template)
        .execute(pool)
        .await?;
        done += count;
    }
    if published {
        sqlx::query("UPDATE relay_bucket SET published = pg_current_snapshot()")
            .execute(pool)
            .await?;
    }
    // No ANALYZE: the relay's read must keep its shape on a table whose
    // statistics lag behind, as they do on a busy one.
    Ok(())
}

async fn pending(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(flotilla_store::outbox::backlog(pool).await?.0)
}

/// Whether any row is left unpublished: the first one found ends each
/// bucket's look, so polling it costs little however large the backlog
/// (counting it, as `pending` does, visits every row's page, and polled
/// every 200 ms that took a core from the relay it measured).
async fn any_pending(pool: &PgPool) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (
             SELECT 1 FROM relay_bucket b CROSS JOIN LATERAL (
                 SELECT 1 FROM workflow_run_outbox o
                 WHERE o.bucket = b.bucket AND o.txid >= pg_snapshot_xmin(b.published)
                   AND NOT pg_visible_in_snapshot(o.txid, b.published) LIMIT 1) o)",
    )
    .fetch_one(pool)
    .await?)
}

/// Drains `backlog` rows not published (after `history` published ones) with one
/// relay; returns events per second.
async fn drain(backlog: i64, history: i64) -> anyhow::Result<f64> {
    let database = ScratchDatabase::create("bench_relay", 8).await?;
    let pool = database.pool.clone();
    insert_rows(&pool, history / EVENTS_PER_JOB, true).await?;
    insert_rows(&pool, backlog / EVENTS_PER_JOB, false).await?;
    let total = pending(&pool).await?;
    let elapsed = publish_all(&pool).await?;
    database.drop_now().await?;
    #[allow(clippy::cast_precision_loss)]
    Ok(total as f64 / elapsed.as_secs_f64())
}

/// Publishes every unpublished row of `pool`'s outbox with one relay to
/// librdkafka's mock cluster, and stops it; returns the time from its start
/// to the last batch's progress moving.
pub(crate) async fn publish_all(pool: &PgPool) -> anyhow::Result<Duration> {
    let cluster: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1)?;
    let topic = "workflow-run-events";
    cluster.create_topic(topic, 12, 1)?;
    let settings = RelaySettings::new(
        flotilla_runtime::BrokerConfig::new(&cluster.bootstrap_servers()),
        topic,
        "bench-relay",
    );
    let relay = Relay::new(pool.clone(), Arc::new(SystemClock), settings)?;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let started_at = Utc::now();
    let running = {
        let stop = stop.clone();
        tokio::spawn(async move { relay.run(stop, Duration::from_secs(10)).await })
    };
    let deadline = started + Duration::from_secs(600);
    while any_pending(pool).await? {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the relay did not drain in 10 minutes"
        );
        // Counting is not free: poll gently, and take the end from the
        // rows themselves below, not from when the count saw zero.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // When the last bucket's progress moved.
    let finished_at: chrono::DateTime<Utc> =
        sqlx::query_scalar("SELECT max(published_at) FROM relay_bucket WHERE published_at >= $1")
            .bind(started_at)
            .fetch_one(pool)
            .await?;
    let elapsed = (finished_at - started_at)
        .to_std()
        .unwrap_or_else(|_| started.elapsed());
    stop.cancel();
    running.await?;
    drop(cluster);
    Ok(elapsed)
}

/// The relay's figures: events/s with a backlog, then with history.
pub(crate) async fn run(report: &mut Report, smoke: bool) -> anyhow::Result<()> {
    let (backlog, history) = if smoke {
        (5_000, 20_000)
    } else {
        (100_000, 1_000_000)
    };
    let empty = drain(backlog, 0).await?;
    report.add(
        "relay",
        format!("events/s, {backlog} pending, no history"),
        empty,
        "events/s",
    );
    let retained = drain(backlog, history).await?;
    report.add(
        "relay",
        format!("events/s, {backlog} pending, {history} published retained"),
        retained,
        "events/s",
    );
    report.add("relay", "with history / without", retained / empty, "ratio");
    Ok(())
}
