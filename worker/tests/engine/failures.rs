//! The failure taxonomy: retryable with backoff then DEAD, verdicts, defects,
//! deadlines, and checkpoints that no longer fit their definition.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{Clock, Engine, Outcome, RefusalMode};
use flotilla_worker::targets::http::HttpTarget;
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{self, Calls, echo_targets, engine, manual_clock, one_step, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_failing_validate_rule_is_a_verdict(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    let workflow = one_step(
        "judged",
        "echo",
        json!({"rules": ["age = input.age"], "validate": ["response.request.age >= 18"]}),
    );
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "judged", json!({"age": 12})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let failed = row(&pool, job_id).await;
    assert_eq!(failed.status, RunStatus::Failed);
    assert_eq!(
        failed.verdict.as_deref(),
        Some("only: response.request.age >= 18")
    );
    assert!(failed.error.unwrap().contains("failed validation"));
    assert_eq!(
        failed.checkpoints.0,
        json!([]),
        "a refused response is not checkpointed"
    );
    assert_eq!(
        support::event_types(&pool, job_id).await,
        [E::Accepted, E::Failed]
    );
}

/// An HTTP target on port 0 answering `/<status>` with that status, and
/// echoing the idempotency key it received on 200.
async fn status_server() -> String {
    let app = axum::Router::new().route(
        "/{status}",
        post(
            |Path(status): Path<u16>, headers: HeaderMap, Json(body): Json<Value>| async move {
                let status = StatusCode::from_u16(status).unwrap();
                let key = headers
                    .get("idempotency-key")
                    .map(|v| v.to_str().unwrap().to_owned());
                let answer = match status.as_u16() {
                    422 => json!({"violations": ["name is on a sanctions list"]}),
                    _ => json!({"idempotency_key": key, "echo": body}),
                };
                (status, Json(answer))
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn http_engine(pool: &PgPool) -> Engine {
    let mut targets = Targets::default();
    let target = HttpTarget::new(
        &status_server().await,
        Duration::from_secs(5),
        flotilla_worker::targets::http::DEFAULT_MAX_RESPONSE_BYTES,
    )
    .unwrap();
    targets.register("http", Arc::new(target), 8);
    engine(pool, targets, manual_clock(), "w")
}

async fn run_against_status(engine: &Engine, status: u16) -> uuid::Uuid {
    let name = format!("status-{status}");
    let workflow = json!({"name": name, "input_schema": {}, "steps": [{"name": "call", "target": "http", "method": status.to_string(), "rules": ["x = 1"]}]});
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(engine, &name, json!({})).await;
    engine.run_once().await.unwrap();
    job_id
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn http_target_statuses_map_to_the_failure_taxonomy(pool: PgPool) {
    let engine = http_engine(&pool).await;

    let ok = run_against_status(&engine, 200).await;
    let done = row(&pool, ok).await;
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(
        done.result.unwrap().0,
        json!({"idempotency_key": format!("{ok}:call"), "echo": {"x": 1}})
    );

    let verdict = run_against_status(&engine, 422).await;
    let failed = row(&pool, verdict).await;
    assert_eq!(failed.status, RunStatus::Failed);
    assert_eq!(
        failed.verdict.as_deref(),
        Some("name is on a sanctions list")
    );

    // 403: the credentials were accepted and this request refused.
    for defect in [400, 403, 500] {
        let job_id = run_against_status(&engine, defect).await;
        let failed = row(&pool, job_id).await;
        assert_eq!(failed.status, RunStatus::Failed, "{defect}");
        assert_eq!(failed.verdict, None, "a defect is not a verdict");
        assert!(failed.error.unwrap().contains(&defect.to_string()));
    }

    // 401 and 407: refused credentials (rotated, misconfigured) wait for
    // an operator with backoff instead of failing every job of the target.
    for retry in [503, 401, 407] {
        let job_id = run_against_status(&engine, retry).await;
        let queued = row(&pool, job_id).await;
        assert_eq!(queued.status, RunStatus::Queued, "{retry}");
        assert!(queued.error.unwrap().contains(&retry.to_string()));
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_segment_past_its_deadline_is_retryable(pool: PgPool) {
    let mut targets = Targets::default();
    targets.register(
        "sleepy",
        Arc::new(FnTarget(|_call: TargetCall| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok::<_, StepFailure>(json!({}))
        })),
        8,
    );
    let engine = engine(&pool, targets, manual_clock(), "w");
    let mut workflow = one_step("slow", "sleepy", json!({}));
    workflow["deadline_ms"] = json!(200);
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "slow", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
    let error = row(&pool, job_id).await.error.unwrap();
    assert_eq!(
        error,
        "step only: the segment deadline of 200 ms passed while waiting for target sleepy (attempt 1 of 3 failed)"
    );
}

/// A definition cannot hold a target's connection longer than the operator
/// allows: a step's `timeout_ms` (and the segment's deadline) above the
/// target's timeout are cut to it.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_step_timeout_above_its_targets_is_cut_to_the_targets(pool: PgPool) {
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let mut targets = Targets::default();
    let http = HttpTarget::new(&url, Duration::from_millis(200), 1024).unwrap();
    targets.register("silent", Arc::new(http), 8);
    let engine = engine(&pool, targets, manual_clock(), "w");
    let mut workflow = one_step("patient", "silent", json!({"timeout_ms": 3_600_000}));
    workflow["deadline_ms"] = json!(3_600_000);
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "patient", json!({})).await;
    let started = std::time::Instant::now();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
    let error = row(&pool, job_id).await.error.unwrap();
    assert_eq!(
        error,
        "step only: target silent did not answer within 200 ms (the target's timeout) (attempt 1 of 3 failed)"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the hour was kept"
    );
    drop(silent);
}

/// Runs two jobs queued at the same instant (so in either order) and checks
/// what became of each.
async fn run_two(engine: &Engine, mut expected: [Outcome; 2]) {
    let mut outcomes = [
        engine.run_once().await.unwrap(),
        engine.run_once().await.unwrap(),
    ];
    let by_text = |outcome: &Outcome| format!("{outcome:?}");
    outcomes.sort_by_key(by_text);
    expected.sort_by_key(by_text);
    assert_eq!(outcomes, expected);
}

/// Whether the row of `job_id` keeps its own copy of the definition.
async fn keeps_a_copy(pool: &PgPool, job_id: Uuid) -> bool {
    sqlx::query_scalar("SELECT definition IS NOT NULL FROM workflow_run WHERE job_id = $1")
        .bind(job_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_that_points_at_its_stored_version_is_not_shifted_by_an_edit(pool: PgPool) {
    let calls = Calls::default();
    let mut settings = support::settings("w");
    settings.definition_by_reference = flotilla_worker::engine::Switch::True;
    // Only the layout under test: checkpoints stay in the row's array.
    settings.checkpoint_rows = flotilla_worker::engine::Switch::False;
    let engine = Engine::new(pool.clone(), echo_targets(&calls), manual_clock(), settings);
    engine.settle_switches(true).await.unwrap();
    engine
        .register_workflow(&support::three_steps("pointed", "echo"))
        .await
        .unwrap();
    let pointing = submit(&engine, "pointed", json!({"n": 1})).await;
    let inline = Uuid::new_v4();
    engine
        .submit(
            support::inline(
                inline,
                support::three_steps("inline", "echo"),
                json!({"n": 1}),
            ),
            RefusalMode::Refuse,
        )
        .await
        .unwrap();
    assert!(
        !keeps_a_copy(&pool, pointing).await,
        "a stored workflow's job points at its version"
    );
    assert!(
        keeps_a_copy(&pool, inline).await,
        "an inline definition has nothing to point at"
    );

    let edited = json!({"name": "pointed", "input_schema": {}, "steps": [{"name": "other", "target": "echo", "method": "m"}]});
    let v2 = engine.register_workflow(&edited).await.unwrap();
    assert_eq!(v2.definition.version, 2);
    run_two(
        &engine,
        [Outcome::Completed(pointing), Outcome::Completed(inline)],
    )
    .await;
    assert_eq!(
        calls.of(pointing),
        ["one", "two", "three"],
        "the job ran version 1"
    );
    assert_eq!(calls.of(inline), ["one", "two", "three"]);
    let read_back = row(&pool, pointing).await;
    assert_eq!(read_back.workflow_version, Some(1));
    assert_eq!(
        read_back.definition.0,
        support::three_steps("pointed", "echo"),
        "reads give the version's document"
    );

    let removed =
        sqlx::query("DELETE FROM workflow_definition WHERE name = 'pointed' AND version = 1")
            .execute(&pool)
            .await
            .unwrap_err();
    assert!(removed.to_string().contains("immutable"), "{removed}");
    let edited_in_place =
        sqlx::query("UPDATE workflow_definition SET definition = '{}' WHERE name = 'pointed'")
            .execute(&pool)
            .await
            .unwrap_err();
    assert!(
        edited_in_place.to_string().contains("immutable"),
        "{edited_in_place}"
    );

    // The statement docs/operations.md gives for a rollback to a release
    // that reads only copies.
    sqlx::query(
        "UPDATE workflow_run r SET definition = d.definition,
             reader_level = CASE WHEN r.has_checkpoint_rows THEN 1 ELSE 0 END
         FROM workflow_definition d
         WHERE r.definition IS NULL
           AND d.name = r.workflow_name AND d.version = r.workflow_version",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert!(keeps_a_copy(&pool, pointing).await);
    assert_eq!(row(&pool, pointing).await.reader_level, 0);
    assert_eq!(
        row(&pool, pointing).await.definition.0,
        support::three_steps("pointed", "echo"),
        "the copy is version 1's document"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_row_pointing_at_a_version_that_does_not_exist_fails_alone(pool: PgPool) {
    let calls = Calls::default();
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&calls), clock.clone(), "w");
    engine
        .register_workflow(&support::three_steps("real", "echo"))
        .await
        .unwrap();
    // Written by something other than a worker: no copy, no such version.
    let dangling = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, workflow_version, input, request_digest, status, max_attempts,
             event_sequence, run_after, created_at)
         VALUES ($1, 'real', 7, '{}', 'd', 'QUEUED', 3, 1, $2, $2)",
    )
    .bind(dangling)
    .bind(clock.now())
    .execute(&pool)
    .await
    .unwrap();
    let good = submit(&engine, "real", json!({"n": 1})).await;
    run_two(
        &engine,
        [Outcome::Failed(dangling), Outcome::Completed(good)],
    )
    .await;
    let failed = row(&pool, dangling).await;
    assert_eq!(failed.status, RunStatus::Failed);
    assert!(failed.error.unwrap().contains("no longer compiles"));

    let neither = sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, input, request_digest, status, max_attempts)
         VALUES (gen_random_uuid(), 'real', '{}', 'd', 'QUEUED', 3)",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    assert!(
        neither
            .to_string()
            .contains("workflow_run_definition_known"),
        "{neither}"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn editing_a_workflow_does_not_shift_a_live_job(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    engine
        .register_workflow(&support::three_steps("evolving", "echo"))
        .await
        .unwrap();
    let job_id = submit(&engine, "evolving", json!({"n": 1})).await;

    let mut edited = json!({"name": "evolving", "input_schema": {}, "steps": [{"name": "other", "target": "echo", "method": "m"}]});
    let v2 = engine.register_workflow(&edited).await.unwrap();
    assert_eq!((v2.definition.version, v2.created), (2, true));
    let again = engine.register_workflow(&edited).await.unwrap();
    assert_eq!(
        (again.definition.version, again.created),
        (2, false),
        "same document, no new version"
    );
    edited["steps"][0]["name"] = json!("renamed");
    assert_eq!(
        engine
            .register_workflow(&edited)
            .await
            .unwrap()
            .definition
            .version,
        3
    );

    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        calls.of(job_id),
        ["one", "two", "three"],
        "the job ran its snapshot"
    );
    assert_eq!(row(&pool, job_id).await.workflow_version, Some(1));

    let newer = submit(&engine, "evolving", json!({})).await;
    engine.run_once().await.unwrap();
    assert_eq!(
        calls.of(newer),
        ["renamed"],
        "new submissions get the newest version"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_stored_checkpoint_that_no_longer_matches_its_step_fails_the_job_loudly(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), manual_clock(), "w");
    let mut workflow = support::three_steps("strict", "echo");
    workflow["steps"][0]["output_schema"] = json!({"type": "object", "required": ["step"]});
    engine.register_workflow(&workflow).await.unwrap();

    for (bad, expected) in [
        (
            json!([{"name": "two", "skipped": false, "response": {}}]),
            "checkpoint 0 (two) comes before one of step \"one\", which it needs",
        ),
        (
            json!([{"name": "gone", "skipped": false, "response": {}}]),
            "checkpoint 0 names step \"gone\", which the workflow does not have",
        ),
        (
            json!([{"name": "one", "skipped": false, "response": {"step": 1}},
                   {"name": "one", "skipped": false, "response": {"step": 1}}]),
            "checkpoint 1 repeats step \"one\"",
        ),
        (
            json!([{"name": "one", "skipped": false, "response": {"nope": 1}}]),
            "checkpoint 0 (one) no longer fits",
        ),
        (json!([{"name": "one"}]), "checkpoint 0 is malformed"),
    ] {
        let job_id = submit(&engine, "strict", json!({"n": 1})).await;
        sqlx::query("UPDATE workflow_run SET checkpoints = $2 WHERE job_id = $1")
            .bind(job_id)
            .bind(&bad)
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
        let failed = row(&pool, job_id).await;
        assert!(
            failed.error.as_deref().unwrap().contains(expected),
            "{:?}",
            failed.error
        );
        assert!(
            calls.of(job_id).is_empty(),
            "no step runs over a broken history"
        );
    }
}
