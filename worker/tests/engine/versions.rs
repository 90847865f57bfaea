//! Versions that stay put: what start-up registration adds, and requests
//! that name the version they run.

use flotilla_contracts::WorkflowRunEventType;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{RefusalMode, Submission, SubmitError, WorkflowRef};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{self, Calls, echo_targets, engine, manual_clock, row};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// A rolling deploy: a worker started with the older workflows directory
/// after one with the newer must not make the older document the newest
/// version again (new submissions would flip between the two). Putting
/// an older document back on purpose (the API's PUT) still does.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_started_with_an_older_workflows_directory_does_not_make_the_older_definition_newest(
    pool: PgPool,
) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    let directory = |document: &serde_json::Value| {
        let dir = std::env::temp_dir().join(format!("flotilla-workflows-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("w.json"), document.to_string()).unwrap();
        dir
    };
    let older = support::three_steps("rolling", "echo");
    let mut newer = older.clone();
    newer["max_attempts"] = json!(5);
    let (old_dir, new_dir) = (directory(&older), directory(&newer));
    let version_of_start = async |dir: &std::path::Path| {
        let loaded = engine.register_workflows_dir(dir).await.unwrap();
        loaded[0].version
    };
    assert_eq!(version_of_start(&old_dir).await, 1);
    assert_eq!(version_of_start(&new_dir).await, 2);
    // The old worker restarts mid-deploy: its file is version 1, kept.
    assert_eq!(version_of_start(&old_dir).await, 1);
    let newest = engine.workflow("rolling").await.unwrap().unwrap();
    assert_eq!(newest.version, 2);
    assert_eq!(newest.definition.0, newer);
    // An operator putting the older document back means it.
    let put = engine.register_workflow(&older).await.unwrap();
    assert!(put.created);
    assert_eq!(put.definition.version, 3);
    for dir in [old_dir, new_dir] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// A request naming version 1 runs version 1's document after version 2
/// was registered; one naming none runs the newest; a version the name
/// never had is refused (or recorded FAILED, as a request from the topic
/// is); naming a version is part of the request, so the same job id
/// without it is a conflict.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_request_naming_an_older_version_runs_it_while_others_run_the_newest(pool: PgPool) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    let first = support::three_steps("pinned", "echo");
    let mut second = first.clone();
    second["max_attempts"] = json!(7);
    engine.register_workflow(&first).await.unwrap();
    engine.register_workflow(&second).await.unwrap();
    let submit = async |job_id: Uuid, workflow: WorkflowRef, mode: RefusalMode| {
        let submission = Submission {
            workflow,
            ..support::stored(job_id, "pinned", json!({"n": 1}))
        };
        engine.submit(submission, mode).await
    };
    let (pinned, newest) = (Uuid::new_v4(), Uuid::new_v4());
    let version = |v| WorkflowRef::Version("pinned".into(), v);
    submit(pinned, version(1), RefusalMode::Refuse)
        .await
        .unwrap();
    submit(
        newest,
        WorkflowRef::Stored("pinned".into()),
        RefusalMode::Refuse,
    )
    .await
    .unwrap();
    let (pinned_row, newest_row) = (row(&pool, pinned).await, row(&pool, newest).await);
    assert_eq!(
        (pinned_row.workflow_version, pinned_row.max_attempts),
        (Some(1), 3)
    );
    assert_eq!(
        (newest_row.workflow_version, newest_row.max_attempts),
        (Some(2), 7)
    );
    let repeat = submit(
        pinned,
        WorkflowRef::Stored("pinned".into()),
        RefusalMode::Refuse,
    )
    .await;
    assert!(
        matches!(repeat, Err(SubmitError::Conflict(id)) if id == pinned),
        "{repeat:?}"
    );

    let ghost = submit(Uuid::new_v4(), version(9), RefusalMode::Refuse).await;
    assert!(
        matches!(&ghost, Err(SubmitError::UnknownVersion { name, version: 9 }) if name == "pinned"),
        "{ghost:?}"
    );
    let recorded = Uuid::new_v4();
    submit(recorded, version(9), RefusalMode::Record)
        .await
        .unwrap();
    let failed = row(&pool, recorded).await;
    assert_eq!(failed.status, RunStatus::Failed);
    assert!(
        failed
            .error
            .unwrap_or_default()
            .contains("has no version 9")
    );
    let zero = submit(Uuid::new_v4(), version(0), RefusalMode::Refuse).await;
    assert!(matches!(zero, Err(SubmitError::Unstorable(_))), "{zero:?}");
}

/// A FAILED job retried onto the latest version: the steps equal in both
/// versions (and needing only such steps) keep their checkpoints and are
/// not called again; the changed step and the one after it run on the new
/// version. Checked with checkpoints in the row's array and as rows, and
/// with definitions copied and by reference.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_failed_job_retried_onto_the_latest_version_keeps_the_checkpoints_of_unchanged_steps(
    pool: PgPool,
) {
    use flotilla_worker::engine::{OperatorError, Outcome, Switch};
    use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall};
    use std::sync::Arc;

    let layouts = [(Switch::False, Switch::False), (Switch::True, Switch::True)];
    for (round, (rows, by_reference)) in layouts.into_iter().enumerate() {
        let calls = Calls::default();
        let mut targets = echo_targets(&calls);
        targets.register(
            "broken",
            Arc::new(FnTarget(|_call: TargetCall| async {
                Err::<serde_json::Value, _>(StepFailure::Defect("500: the ledger broke".into()))
            })),
            8,
        );
        let mut settings = support::settings("w");
        settings.checkpoint_rows = rows;
        settings.definition_by_reference = by_reference;
        let engine =
            flotilla_worker::engine::Engine::new(pool.clone(), targets, manual_clock(), settings);
        engine.settle_switches(true).await.unwrap();
        let name = format!("ledger-{round}");
        let version = |b_target: &str| {
            json!({
                "name": name, "input_schema": {},
                "steps": [
                    {"name": "a", "target": "echo", "method": "go"},
                    {"name": "b", "target": b_target, "method": "go"},
                    {"name": "c", "target": "echo", "method": "go"}
                ]
            })
        };
        engine.register_workflow(&version("broken")).await.unwrap();
        let job_id = support::submit(&engine, &name, json!({})).await;
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
        assert_eq!(calls.of(job_id), ["a"]);

        // Not yet a version 2: refused, nothing changed.
        let refused = engine.retry_onto(job_id, Some(2)).await;
        assert!(
            matches!(refused, Err(OperatorError::NoSuchVersion(_))),
            "{refused:?}"
        );
        assert_eq!(row(&pool, job_id).await.status, RunStatus::Failed);

        engine.register_workflow(&version("echo")).await.unwrap();
        let (moved, run_again) = engine.retry_onto(job_id, None).await.unwrap();
        assert_eq!(run_again, ["b", "c"]);
        assert_eq!(moved.workflow_version, Some(2));
        assert_eq!(moved.status, RunStatus::Queued);
        assert_eq!(support::checkpoint_names(&moved), ["a"]);
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
        assert_eq!(calls.of(job_id), ["a", "b", "c"], "a is not called again");
        assert_eq!(row(&pool, job_id).await.workflow_version, Some(2));
        // Its events say which version each state change ran on.
        let events = support::events(&pool, job_id).await;
        let failed_at = events
            .iter()
            .position(|e| e.event_type() == WorkflowRunEventType::Failed)
            .unwrap();
        let versions: Vec<_> = events.iter().map(|e| e.workflow_version()).collect();
        assert!(
            versions[..=failed_at].iter().all(|v| *v == Some(1)),
            "{versions:?}"
        );
        assert!(
            versions[failed_at + 1..].iter().all(|v| *v == Some(2)),
            "{versions:?}"
        );
        assert_eq!(
            events.last().unwrap().event_type(),
            WorkflowRunEventType::Completed
        );

        // A COMPLETED job is not retried, onto any version.
        let done = engine.retry_onto(job_id, Some(1)).await;
        assert!(
            matches!(done, Err(OperatorError::WrongState { .. })),
            "{done:?}"
        );
    }
}

/// A job of an inline definition has no versions to move to.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_of_an_inline_definition_cannot_be_moved_to_a_version(pool: PgPool) {
    use flotilla_worker::engine::{OperatorError, Outcome};
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    let document = json!({
        "name": "inline", "input_schema": {},
        "steps": [{"name": "a", "wait_for": "go", "timeout_ms": 1, "on_timeout": "fail"}]
    });
    let job_id = Uuid::new_v4();
    engine
        .submit(
            support::inline(job_id, document, json!({})),
            RefusalMode::Refuse,
        )
        .await
        .unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    clock.advance(std::time::Duration::from_millis(5));
    engine.wake_due_waits().await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let refused = engine.retry_onto(job_id, None).await;
    assert!(
        matches!(&refused, Err(OperatorError::NoSuchVersion(why)) if why.contains("inline")),
        "{refused:?}"
    );
    let events = support::events(&pool, job_id).await;
    assert!(!events.is_empty());
    assert!(
        events.iter().all(|e| e.workflow_version().is_none()),
        "an inline definition has no version to tell"
    );
}

/// A wait that runs again on the new version takes again the signal it
/// took before (the move gives it back): the sender is not asked twice.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_taken_by_a_step_that_runs_again_is_taken_again(pool: PgPool) {
    use flotilla_worker::engine::ops::signal::Signal;
    use flotilla_worker::engine::{Outcome, Switch};
    use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall};
    use std::sync::Arc;

    let calls = Calls::default();
    let mut targets = echo_targets(&calls);
    targets.register(
        "broken",
        Arc::new(FnTarget(|_call: TargetCall| async {
            Err::<serde_json::Value, _>(StepFailure::Defect("500".into()))
        })),
        8,
    );
    let mut settings = support::settings("w");
    settings.definition_by_reference = Switch::False;
    let engine =
        flotilla_worker::engine::Engine::new(pool.clone(), targets, manual_clock(), settings);
    let version = |then: &str, validate: serde_json::Value| {
        json!({
            "name": "signalled", "input_schema": {},
            "steps": [
                {"name": "go", "wait_for": "go", "validate": validate},
                {"name": "then", "target": then, "method": "m"}
            ]
        })
    };
    engine
        .register_workflow(&version("broken", json!([])))
        .await
        .unwrap();
    let job_id = support::submit(&engine, "signalled", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let signal = Signal {
        job_id,
        name: "go".into(),
        payload: json!({"ok": true}),
        source: json!({}),
        idempotency_key: "once".into(),
    };
    engine.send_signal(signal).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));

    let changed = version("echo", json!(["response.ok == true"]));
    engine.register_workflow(&changed).await.unwrap();
    let (_, run_again) = engine.retry_onto(job_id, None).await.unwrap();
    assert_eq!(run_again, ["go", "then"]);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(calls.of(job_id), ["then"]);
}
