//! Versions that stay put: what start-up registration adds, and requests
//! that name the version they run.

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
