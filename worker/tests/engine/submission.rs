//! Submission: validation before any write, idempotency on job_id, and
//! refusals recorded as FAILED rows for the consumer.

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{RefusalMode, SubmitError, Submitted};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{self, Calls, echo_targets, engine, manual_clock, row, rows, stored};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_repeated_job_id_is_idempotent_and_different_content_conflicts(pool: PgPool) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    engine
        .register_workflow(&support::three_steps("idem", "echo"))
        .await
        .unwrap();
    let job_id = Uuid::new_v4();
    let first = engine
        .submit(stored(job_id, "idem", json!({"n": 1})), RefusalMode::Refuse)
        .await
        .unwrap();
    assert!(matches!(first, Submitted::Created(_)));
    let again = engine
        .submit(stored(job_id, "idem", json!({"n": 1})), RefusalMode::Refuse)
        .await
        .unwrap();
    assert!(matches!(again, Submitted::Existing(ref row) if row.job_id == job_id));
    let other = engine
        .submit(stored(job_id, "idem", json!({"n": 2})), RefusalMode::Refuse)
        .await;
    assert!(matches!(other, Err(SubmitError::Conflict(id)) if id == job_id));
    assert_eq!(rows(&pool).await, 1);
    assert_eq!(
        row(&pool, job_id).await.input.0,
        json!({"n": 1}),
        "the original stays"
    );
    assert_eq!(
        support::event_types(&pool, job_id).await,
        [E::Accepted],
        "one ACCEPTED event"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_input_that_fails_the_schema_is_refused_before_anything_is_written(pool: PgPool) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    engine
        .register_workflow(&support::three_steps("typed", "echo"))
        .await
        .unwrap();
    let refused = engine
        .submit(
            stored(Uuid::new_v4(), "typed", json!({"n": "seven"})),
            RefusalMode::Refuse,
        )
        .await;
    let Err(SubmitError::InvalidInput {
        workflow,
        violations,
    }) = refused
    else {
        panic!("{refused:?}")
    };
    assert_eq!(workflow, "typed");
    assert!(violations[0].starts_with("/n:"), "{violations:?}");
    assert_eq!(rows(&pool).await, 0);

    let job_id = Uuid::new_v4();
    let recorded = engine
        .submit(stored(job_id, "typed", json!({})), RefusalMode::Record)
        .await
        .unwrap();
    assert!(matches!(recorded, Submitted::Created(_)));
    let failed = row(&pool, job_id).await;
    assert_eq!(failed.status, RunStatus::Failed);
    assert!(
        failed
            .error
            .unwrap()
            .contains("\"n\" is a required property")
    );
    let events = support::events(&pool, job_id).await;
    assert_eq!(
        events.iter().map(|e| e.event_type()).collect::<Vec<_>>(),
        [E::Failed]
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_unknown_workflow_is_refused_or_recorded_as_failed(pool: PgPool) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    let refused = engine
        .submit(
            stored(Uuid::new_v4(), "ghost", json!({})),
            RefusalMode::Refuse,
        )
        .await;
    assert!(matches!(refused, Err(SubmitError::UnknownWorkflow(ref name)) if name == "ghost"));
    assert_eq!(rows(&pool).await, 0);

    let job_id = Uuid::new_v4();
    engine
        .submit(stored(job_id, "ghost", json!({})), RefusalMode::Record)
        .await
        .unwrap();
    let failed = row(&pool, job_id).await;
    assert_eq!(
        (failed.status, failed.workflow_name.as_str()),
        (RunStatus::Failed, "ghost")
    );
    assert!(failed.error.unwrap().contains("unknown workflow \"ghost\""));
    assert_eq!(support::event_types(&pool, job_id).await, [E::Failed]);
    // Redelivered, the same request finds its FAILED row.
    let again = engine
        .submit(stored(job_id, "ghost", json!({})), RefusalMode::Record)
        .await
        .unwrap();
    assert!(matches!(again, Submitted::Existing(_)));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_bad_definition_is_refused_with_every_problem_named(pool: PgPool) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    let bad = json!({
        "name": "broken",
        "input_schema": {"type": "no-such-type"},
        "steps": [
            {"name": "a", "target": "nowhere", "method": "m", "rules": ["x = (1 +"]},
            {"name": "a", "target": "echo", "method": "m", "rules": ["1x = 2", "no assignment"],
             "validate": ["response.ok &&"], "output_schema": {"type": 12}}
        ],
        "verdict": "'unclosed",
        "max_attempts": 0
    });
    let err = engine.register_workflow(&bad).await.unwrap_err();
    let flotilla_worker::engine::RegisterError::Invalid(invalid) = err else {
        panic!("{err}")
    };
    let located: Vec<(Option<&str>, &str)> = invalid
        .problems
        .iter()
        .map(|p| (p.step.as_deref(), p.field.as_str()))
        .collect();
    for expected in [
        (None, "max_attempts"),
        (None, "input_schema"),
        (Some("a"), "target"),
        (Some("a"), "rules[0]"),
        (Some("a"), "name"),
        (Some("a"), "rules[1]"),
        (Some("a"), "output_schema"),
        (Some("a"), "validate[0]"),
        (None, "verdict"),
    ] {
        assert!(
            located.contains(&expected),
            "{expected:?} missing from {located:?}"
        );
    }
    assert!(invalid.to_string().contains("unknown target \"nowhere\""));

    assert!(matches!(
        engine
            .submit(
                support::inline(Uuid::new_v4(), bad, json!({})),
                RefusalMode::Refuse
            )
            .await,
        Err(SubmitError::InvalidDefinition(_))
    ));
    assert_eq!(rows(&pool).await, 0);
    let stored_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_definition")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored_rows, 0);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn workflows_load_from_a_directory_and_reloading_adds_no_version(pool: PgPool) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    let dir = std::env::temp_dir().join(format!("flotilla-workflows-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("a.json"),
        support::three_steps("from-json", "echo").to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("b.yaml"),
        "name: from-yaml\ninput_schema: {}\nsteps:\n  - name: s\n    target: echo\n    method: m\n",
    )
    .unwrap();
    std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
    let loaded = engine.register_workflows_dir(&dir).await.unwrap();
    assert_eq!(
        loaded
            .iter()
            .map(|d| (d.name.as_str(), d.version))
            .collect::<Vec<_>>(),
        [("from-json", 1), ("from-yaml", 1)]
    );
    let reloaded = engine.register_workflows_dir(&dir).await.unwrap();
    assert_eq!(
        reloaded.iter().map(|d| d.version).collect::<Vec<_>>(),
        [1, 1]
    );

    std::fs::write(dir.join("c.json"), "{ not json").unwrap();
    let err = engine.register_workflows_dir(&dir).await.unwrap_err();
    assert!(err.to_string().contains("c.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A batch from the request topic is written in one statement for its rows
/// and one for their events, yet every request keeps its own outcome: new
/// rows, a repeat of an earlier job, a conflict, the same job id twice in
/// the batch, and a refusal recorded as a FAILED row.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_batch_gives_each_request_its_own_outcome(pool: PgPool) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    engine
        .register_workflow(&support::three_steps("batched", "echo"))
        .await
        .unwrap();
    let (earlier, twice) = (Uuid::new_v4(), Uuid::new_v4());
    engine
        .submit(
            stored(earlier, "batched", json!({"n": 0})),
            RefusalMode::Refuse,
        )
        .await
        .unwrap();
    let fresh = Uuid::new_v4();
    let refused = Uuid::new_v4();
    let results = engine
        .submit_batch(vec![
            stored(fresh, "batched", json!({"n": 1})),
            stored(earlier, "batched", json!({"n": 0})),
            stored(earlier, "batched", json!({"n": 99})),
            stored(twice, "batched", json!({"n": 2})),
            stored(twice, "batched", json!({"n": 2})),
            stored(refused, "no-such-workflow", json!({})),
        ])
        .await
        .unwrap();
    let outcome = |i: usize| match &results[i] {
        Ok(Submitted::Created(row)) => format!("created {} {:?}", row.job_id, row.status),
        Ok(Submitted::Existing(row)) => format!("existing {}", row.job_id),
        Ok(Submitted::Removed(removed)) => format!("removed {}", removed.job_id),
        Err(e) => format!("error {e}"),
    };
    assert_eq!(outcome(0), format!("created {fresh} Queued"));
    assert_eq!(outcome(1), format!("existing {earlier}"));
    assert_eq!(
        outcome(2),
        format!("error job {earlier} exists with different content")
    );
    assert_eq!(outcome(3), format!("created {twice} Queued"));
    assert_eq!(outcome(4), format!("existing {twice}"));
    assert_eq!(outcome(5), format!("created {refused} Failed"));
    assert_eq!(rows(&pool).await, 4);
    for (job, first_event) in [
        (fresh, "ACCEPTED"),
        (twice, "ACCEPTED"),
        (refused, "FAILED"),
    ] {
        let events: Vec<(i64, String)> = sqlx::query_as(
            "SELECT sequence, event_type FROM workflow_run_outbox WHERE job_id = $1",
        )
        .bind(job)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(events, vec![(1, first_event.to_owned())], "{job}");
    }
    assert_eq!(row(&pool, twice).await.input.0, json!({"n": 2}));
}

/// The bounds on `deadline_ms` (a day) and `max_attempts` (100) came with
/// a later release than some stored definitions: registering past them is
/// refused, but a definition stored before keeps running, held to the
/// bounds, instead of every job of it failing as a definition that no
/// longer compiles.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_definition_stored_before_the_bounds_keeps_running_held_to_them(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    let old = json!({
        "name": "patient", "input_schema": {}, "deadline_ms": 172_800_000, "max_attempts": 500,
        "steps": [{"name": "one", "target": "echo", "method": "one"}]
    });
    let refused = engine
        .register_workflow(&old)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("deadline_ms") && refused.contains("max_attempts"),
        "{refused}"
    );
    sqlx::query(
        "INSERT INTO workflow_definition (name, version, definition) VALUES ('patient', 1, $1)",
    )
    .bind(&old)
    .execute(&pool)
    .await
    .unwrap();
    let job_id = Uuid::new_v4();
    let submitted = engine
        .submit(stored(job_id, "patient", json!({})), RefusalMode::Refuse)
        .await
        .expect("a job of the stored definition is accepted");
    assert!(matches!(submitted, Submitted::Created(_)), "{submitted:?}");
    assert_eq!(
        engine.run_once().await.unwrap(),
        flotilla_worker::engine::Outcome::Completed(job_id)
    );
    assert_eq!(calls.of(job_id), ["one"]);
    assert_eq!(
        row(&pool, job_id).await.max_attempts,
        100,
        "held to the bound"
    );
}
