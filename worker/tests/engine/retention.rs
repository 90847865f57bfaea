//! Retention of finished runs: a run past its retention (its workflow's
//! for its final state, else the fleet's) is removed with its checkpoints,
//! leaving a record by which the same job id submitted again is a repeat
//! (or a conflict), never a second run, until the horizon; queued and
//! running jobs are never touched, and one member removes at a time.

use std::time::Duration;

use flotilla_store::{Clock as _, RunStatus};
use flotilla_worker::engine::services::retention::{RetentionSettings, WorkflowRetention};
use flotilla_worker::engine::{Engine, Outcome, RefusalMode, SubmitError, Submitted};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{Calls, echo_targets, manual_clock, settings, stored, three_steps};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;
const HOUR: Duration = Duration::from_secs(3600);

/// COMPLETED kept 1 h, FAILED 2 h, except `kept` runs: COMPLETED 10 h;
/// removed ids answered for 24 h.
async fn retaining_engine(pool: &PgPool) -> (Engine, std::sync::Arc<flotilla_store::ManualClock>) {
    let clock = manual_clock();
    let mut settings = settings("w");
    settings.retention = RetentionSettings {
        keep_completed: HOUR,
        keep_failed: 2 * HOUR,
        by_workflow: vec![WorkflowRetention {
            workflow: "kept".into(),
            status: RunStatus::Completed,
            keep: 10 * HOUR,
        }],
        removed_horizon: 24 * HOUR,
        batch: 2,
        ..RetentionSettings::default()
    };
    let engine = Engine::new(
        pool.clone(),
        echo_targets(&Calls::default()),
        clock.clone(),
        settings,
    );
    engine
        .register_workflow(&three_steps("short", "echo"))
        .await
        .unwrap();
    engine
        .register_workflow(&three_steps("kept", "echo"))
        .await
        .unwrap();
    (engine, clock)
}

async fn status_of(pool: &PgPool, job_id: Uuid) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM workflow_run WHERE job_id = $1")
        .bind(job_id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn submit(
    engine: &Engine,
    job_id: Uuid,
    workflow: &str,
    n: i64,
) -> Result<Submitted, SubmitError> {
    engine
        .submit(
            stored(job_id, workflow, json!({"n": n})),
            RefusalMode::Record,
        )
        .await
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn finished_runs_past_their_retention_are_removed_and_a_repeat_of_one_stays_a_repeat(
    pool: PgPool,
) {
    let (engine, clock) = retaining_engine(&pool).await;
    // Five completed `short` runs (more than a batch of 2), one `kept`,
    // one refused (FAILED), one never run.
    let mut short = Vec::new();
    for n in 0..5 {
        let job_id = Uuid::new_v4();
        submit(&engine, job_id, "short", n).await.unwrap();
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
        short.push(job_id);
    }
    let kept = Uuid::new_v4();
    submit(&engine, kept, "kept", 1).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(kept));
    let refused = Uuid::new_v4();
    submit(&engine, refused, "no-such-workflow", 1)
        .await
        .unwrap();
    assert_eq!(status_of(&pool, refused).await.as_deref(), Some("FAILED"));
    clock.advance(HOUR - Duration::from_secs(1));
    let queued = Uuid::new_v4();
    submit(&engine, queued, "short", 9).await.unwrap();

    let pass = engine.apply_retention().await.unwrap();
    assert_eq!(pass.removed, 0, "nothing is an hour old yet");
    clock.advance(Duration::from_secs(2));
    let pass = engine.apply_retention().await.unwrap();
    assert_eq!(
        pass.removed, 5,
        "the completed `short` runs, in batches of 2"
    );
    for job_id in &short {
        assert_eq!(status_of(&pool, *job_id).await, None);
    }
    for job_id in [kept, refused, queued] {
        assert!(status_of(&pool, job_id).await.is_some(), "{job_id} stays");
    }
    let record: (String, String) =
        sqlx::query_as("SELECT workflow_name, status FROM workflow_run_removed WHERE job_id = $1")
            .bind(short[0])
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(record, ("short".into(), "COMPLETED".into()));

    // The same request again is a repeat, other content a conflict: no
    // second run either way.
    match submit(&engine, short[0], "short", 0).await.unwrap() {
        Submitted::Removed(removed) => {
            assert_eq!(removed.status, RunStatus::Completed);
            assert_eq!(removed.removed_at, clock.now());
        }
        other => panic!("a repeat of a removed run: {other:?}"),
    }
    assert!(matches!(
        submit(&engine, short[1], "short", 42).await,
        Err(SubmitError::Conflict(id)) if id == short[1]
    ));
    assert_eq!(status_of(&pool, short[0]).await, None, "no second run");

    clock.advance(HOUR);
    engine.apply_retention().await.unwrap();
    assert_eq!(status_of(&pool, refused).await, None, "FAILED after 2 h");
    assert!(status_of(&pool, kept).await.is_some(), "`kept` keeps 10 h");
    clock.advance(8 * HOUR);
    engine.apply_retention().await.unwrap();
    assert_eq!(status_of(&pool, kept).await, None);
    assert_eq!(
        status_of(&pool, queued).await.as_deref(),
        Some("QUEUED"),
        "never finished"
    );

    // Past the horizon a record goes once its job's events have left the
    // outbox (no relay runs here: they are all still there).
    clock.advance(24 * HOUR);
    assert_eq!(engine.apply_retention().await.unwrap().forgotten, 0);
    // The relay published them and its own retention deleted them: the
    // six removed earlier go; `kept`, removed exactly 24 h ago, not yet.
    sqlx::query("DELETE FROM workflow_run_outbox WHERE NOT job_id = $1")
        .bind(queued)
        .execute(&pool)
        .await
        .unwrap();
    let pass = engine.apply_retention().await.unwrap();
    assert_eq!(pass.forgotten, 6);
    assert!(matches!(
        submit(&engine, short[0], "short", 0).await.unwrap(),
        Submitted::Created(_)
    ));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn one_member_removes_at_a_time(pool: PgPool) {
    let (engine, clock) = retaining_engine(&pool).await;
    let job_id = Uuid::new_v4();
    submit(&engine, job_id, "short", 1).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    clock.advance(2 * HOUR);

    let mut other = crate::support::own_connection(&pool).await;
    sqlx::query("SELECT pg_advisory_lock(hashtext('flotilla.run-retention'))")
        .execute(&mut other)
        .await
        .unwrap();
    let pass = engine.apply_retention().await.unwrap();
    assert!(pass.yielded && pass.removed == 0, "{pass:?}");
    assert!(status_of(&pool, job_id).await.is_some());

    sqlx::query("SELECT pg_advisory_unlock(hashtext('flotilla.run-retention'))")
        .execute(&mut other)
        .await
        .unwrap();
    assert_eq!(engine.apply_retention().await.unwrap().removed, 1);
    assert_eq!(status_of(&pool, job_id).await, None);
}

/// A finished run whose removal the store refuses (here a trigger refuses
/// deleting it as data) stays, said loudly, and the runs behind it are
/// removed still: one bad row is no head of the line, in this pass or the
/// next.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_run_the_store_refuses_to_remove_stays_and_the_others_are_removed(pool: PgPool) {
    let (engine, clock) = retaining_engine(&pool).await;
    crate::support::refuse_as_data(&pool, "DELETE", "OLD.input ? 'poison'").await;
    // The refused run is the oldest: every batch would take it first.
    let poisoned = Uuid::new_v4();
    engine
        .submit(
            stored(poisoned, "short", json!({"n": 1, "poison": true})),
            RefusalMode::Record,
        )
        .await
        .unwrap();
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::Completed(poisoned)
    );
    let mut others = Vec::new();
    for n in 0..3 {
        let job_id = Uuid::new_v4();
        submit(&engine, job_id, "short", n).await.unwrap();
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
        others.push(job_id);
    }
    clock.advance(2 * HOUR);
    let pass = engine
        .apply_retention()
        .await
        .expect("the pass goes past the refused run");
    assert_eq!(pass.removed, 3);
    for job_id in others {
        assert_eq!(status_of(&pool, job_id).await, None);
    }
    assert_eq!(
        status_of(&pool, poisoned).await.as_deref(),
        Some("COMPLETED")
    );
    // Later runs are not held up behind it either.
    let later = Uuid::new_v4();
    submit(&engine, later, "short", 7).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(later));
    clock.advance(2 * HOUR);
    assert_eq!(engine.apply_retention().await.unwrap().removed, 1);
    assert_eq!(status_of(&pool, later).await, None);
}

/// A child is never removed while its parent's row is kept: the parent may
/// still need its outcome (an unfinished parent, or an operator's retry of
/// a finished one restarts the children that did not complete). Here the
/// child's workflow is kept 1 h and the parent's 10 h.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_child_is_kept_while_its_parent_is_and_removed_after_it(pool: PgPool) {
    let (engine, clock) = retaining_engine(&pool).await;
    engine
        .register_workflow(&json!({
            "name": "kept", "input_schema": {},
            "steps": [{"name": "check", "start": {"workflow": "short", "input": ["n = 1"]}}]
        }))
        .await
        .unwrap();
    let parent = Uuid::new_v4();
    engine
        .submit(stored(parent, "kept", json!({})), RefusalMode::Record)
        .await
        .unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parent));
    let child: Uuid =
        sqlx::query_scalar("SELECT job_id FROM workflow_run WHERE parent_job_id = $1")
            .bind(parent)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(child));
    // The parent, queued again by its child's end, has not run yet.
    clock.advance(HOUR + Duration::from_secs(1));
    engine.apply_retention().await.unwrap();
    assert_eq!(
        status_of(&pool, child).await.as_deref(),
        Some("COMPLETED"),
        "removed under a parent that had not taken its outcome"
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(parent));
    clock.advance(HOUR);
    engine.apply_retention().await.unwrap();
    assert!(
        status_of(&pool, child).await.is_some(),
        "kept while its finished parent is"
    );
    clock.advance(10 * HOUR);
    let pass = engine.apply_retention().await.unwrap();
    assert_eq!(pass.removed, 2, "the parent, then its child");
    assert_eq!(status_of(&pool, child).await, None);
}
