//! The one-way switches of the run layout (checkpoint rows, definitions by
//! reference) come on only when no worker that cannot read their runs is
//! alive, and then for the whole database; a worker never claims a run
//! written in a layout newer than it reads.

use flotilla_store::RunStatus;
use flotilla_store::runs::READER_LEVEL;
use flotilla_worker::engine::{CompleteError, Engine, Feature, Outcome, Switch, SwitchError};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{self, Calls, echo_targets, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// A worker of an earlier release: alive, announcing no reader level.
async fn older_worker_alive(pool: &PgPool, worker_id: &str) {
    sqlx::query(
        "INSERT INTO worker_member (worker_id, claim_loops, started_at, last_seen)
         VALUES ($1, 16, now(), now())",
    )
    .bind(worker_id)
    .execute(pool)
    .await
    .unwrap();
}

fn engine(pool: &PgPool, worker_id: &str, switch: Switch) -> Engine {
    let mut settings = support::settings(worker_id);
    settings.checkpoint_rows = switch;
    settings.definition_by_reference = switch;
    Engine::new(
        pool.clone(),
        echo_targets(&Calls::default()),
        manual_clock(),
        settings,
    )
}

/// Runs one 3-step job to completion; returns its id.
async fn one_job(engine: &Engine) -> Uuid {
    let job_id = submit(engine, "layout", json!({"n": 1})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    job_id
}

/// (definition copied, checkpoints as rows, reader level) of a run.
async fn layout(pool: &PgPool, job_id: Uuid) -> (bool, bool, i16) {
    sqlx::query_as(
        "SELECT definition IS NOT NULL, has_checkpoint_rows, reader_level FROM workflow_run WHERE job_id = $1",
    )
    .bind(job_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_switch_at_auto_waits_for_older_workers_then_comes_on_for_the_database(pool: PgPool) {
    older_worker_alive(&pool, "old-release").await;
    let first = engine(&pool, "new-1", Switch::Auto);
    first
        .register_workflow(&support::three_steps("layout", "echo"))
        .await
        .unwrap();
    first.announce().await.unwrap();
    first.settle_switches(false).await.unwrap();
    assert!(!first.uses(Feature::CheckpointRows) && !first.uses(Feature::DefinitionByReference));
    let before = one_job(&first).await;
    assert_eq!(
        layout(&pool, before).await,
        (true, false, 0),
        "the layout every release reads"
    );

    // The older worker stops: the next check turns both on for everyone.
    sqlx::query("DELETE FROM worker_member WHERE worker_id = 'old-release'")
        .execute(&pool)
        .await
        .unwrap();
    first.settle_switches(false).await.unwrap();
    assert!(first.uses(Feature::CheckpointRows) && first.uses(Feature::DefinitionByReference));
    let after = one_job(&first).await;
    assert_eq!(layout(&pool, after).await, (false, true, 1));
    let enabled: Vec<String> = sqlx::query_scalar("SELECT name FROM fleet_feature ORDER BY name")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(enabled, ["checkpoint_rows", "definition_by_reference"]);

    // On for the database: another worker uses them from its first check,
    // even with an older worker back (the switches are one-way).
    older_worker_alive(&pool, "rolled-back").await;
    let second = engine(&pool, "new-2", Switch::Auto);
    second.settle_switches(true).await.unwrap();
    assert!(second.uses(Feature::CheckpointRows) && second.uses(Feature::DefinitionByReference));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_switch_set_true_refuses_to_start_while_an_older_worker_is_alive(pool: PgPool) {
    older_worker_alive(&pool, "old-release").await;
    // A worker of a release before worker rows, known only by the lease it holds.
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest, status,
             attempt, max_attempts, lease_owner, lease_token, lease_until)
         VALUES (gen_random_uuid(), 'w', '{}', '{}', 'd', 'RUNNING', 1, 3, 'ancient',
             gen_random_uuid(), now() + interval '1 minute')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let eager = engine(&pool, "new", Switch::True);
    assert!(
        !eager.uses(Feature::CheckpointRows),
        "off until the check says it may be on"
    );
    eager.announce().await.unwrap();
    match eager.settle_switches(true).await {
        Err(SwitchError::Refused(refused)) => {
            assert_eq!(refused.workers, ["ancient", "old-release"]);
            let message = refused.to_string();
            assert!(
                message.contains("FLOTILLA_CHECKPOINT_ROWS=true"),
                "{message}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // On a later tick (not at start) it stays off while they are alive.
    eager.settle_switches(false).await.unwrap();
    assert!(!eager.uses(Feature::CheckpointRows));
    let off = engine(&pool, "careful", Switch::False);
    off.settle_switches(true).await.unwrap();
    assert!(!off.uses(Feature::CheckpointRows));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_run_written_in_a_newer_layout_is_left_for_a_worker_that_reads_it(pool: PgPool) {
    let engine = engine(&pool, "w", Switch::Auto);
    engine
        .register_workflow(&support::approval())
        .await
        .unwrap();
    let newer = submit(&engine, "approval", json!({})).await;
    sqlx::query("UPDATE workflow_run SET reader_level = $2 WHERE job_id = $1")
        .bind(newer)
        .bind(READER_LEVEL + 1)
        .execute(&pool)
        .await
        .unwrap();
    assert!(engine.claim().await.unwrap().is_none(), "not claimed");
    assert_eq!(row(&pool, newer).await.status, RunStatus::Queued);
    sqlx::query(
        "UPDATE workflow_run SET status = 'WAITING', outstanding_step = 'approve' WHERE job_id = $1",
    )
    .bind(newer)
    .execute(&pool)
    .await
    .unwrap();
    let refused = engine
        .complete_step(newer, "approve", json!({"approved": true}))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            CompleteError::TooNew {
                needs,
                reads: READER_LEVEL,
                ..
            } if needs == READER_LEVEL + 1
        ),
        "{refused}"
    );
    assert_eq!(
        row(&pool, newer).await.status,
        RunStatus::Waiting,
        "untouched"
    );
}
