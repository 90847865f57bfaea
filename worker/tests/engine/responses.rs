//! What targets send back is hostile too: a value the store cannot hold, an
//! error body with a NUL or credentials, a body too large, a redirect. Each
//! settles its own job on the attempt that met it.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{Engine, Outcome};
use flotilla_worker::targets::http::HttpTarget;
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::json;
use sqlx::PgPool;

use crate::support::{engine, event_types, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;
const LIMIT: usize = 1024;

/// A target that misbehaves in every way a real one can.
async fn hostile_server() -> String {
    let json =
        |body: &'static str| ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    let app = axum::Router::new()
        .route(
            "/nul-json",
            post(move || async move { json(r#"{"a": "x\u0000y"}"#) }),
        )
        .route(
            "/nul-error",
            post(|| async {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "broken \0 see https://bob:s3cret@db.internal/x",
                )
            }),
        )
        .route("/big", post(|| async { "x".repeat(LIMIT * 2) }))
        .route(
            "/redirect",
            post(|| async { (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, "/ok")]) }),
        )
        .route("/ok", post(move || async move { json("{}") }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn hostile_engine(pool: &PgPool) -> Engine {
    let mut targets = Targets::default();
    let server = hostile_server().await;
    let http = HttpTarget::new(&server, Duration::from_secs(5), LIMIT).unwrap();
    targets.register("http", Arc::new(http), 8);
    // The operator keeps the first 200 bytes of failed answers.
    let kept = HttpTarget::new(&server, Duration::from_secs(5), LIMIT)
        .unwrap()
        .keep_error_body(200);
    targets.register("http-kept", Arc::new(kept), 8);
    targets.register(
        "nul",
        Arc::new(FnTarget(|_: TargetCall| async {
            Ok::<_, StepFailure>(json!({"greeting": "hi\u{0}there"}))
        })),
        8,
    );
    engine(pool, targets, manual_clock(), "w")
}

/// Runs a one-step workflow calling `method` on `target` once; returns the job.
async fn run_once_against(engine: &Engine, target: &str, method: &str) -> uuid::Uuid {
    let name = format!("{target}-{method}");
    let workflow = json!({"name": name, "input_schema": {}, "max_attempts": 3,
        "steps": [{"name": "call", "target": target, "method": method}]});
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(engine, &name, json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    job_id
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_target_answering_with_a_nul_fails_the_job_on_its_first_attempt_with_the_reason(
    pool: PgPool,
) {
    let engine = hostile_engine(&pool).await;
    for (target, method) in [("nul", "any"), ("http", "nul-json")] {
        let job_id = run_once_against(&engine, target, method).await;
        let failed = row(&pool, job_id).await;
        assert_eq!((failed.status, failed.attempt), (RunStatus::Failed, 1));
        let error = failed.error.unwrap();
        assert!(
            error.contains("the store refused a value of this job"),
            "{error}"
        );
        assert_eq!(event_types(&pool, job_id).await, [E::Accepted, E::Failed]);
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_value_the_store_refuses_still_runs_the_jobs_compensation(pool: PgPool) {
    let engine = hostile_engine(&pool).await;
    engine
        .register_workflow(&json!({
            "name": "charged", "input_schema": {},
            "steps": [{"name": "charge", "target": "http", "method": "ok"},
                      {"name": "greet", "target": "nul", "method": "any"}],
            "on_failure": [{"name": "refund", "target": "http", "method": "ok"}]
        }))
        .await
        .unwrap();
    let job_id = submit(&engine, "charged", json!({})).await;
    let mut segments = 0;
    while engine.run_once().await.unwrap() != Outcome::Idle {
        segments += 1;
        assert!(segments < 10, "the job never settled");
    }
    let failed = row(&pool, job_id).await;
    assert_eq!(failed.status, RunStatus::Failed);
    let error = failed.error.unwrap_or_default();
    assert!(
        error.contains("the store refused a value of this job"),
        "{error}"
    );
    let refunded = failed
        .compensation
        .map(|c| c.0["done"].clone())
        .unwrap_or_default();
    assert_eq!(
        refunded[0]["name"], "refund",
        "the charge was never refunded: {refunded}"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_error_body_is_kept_only_when_the_operator_asks_and_then_sanitised(pool: PgPool) {
    let engine = hostile_engine(&pool).await;
    // By default: the body's length and type, nothing of what it says.
    let job_id = run_once_against(&engine, "http", "nul-error").await;
    let error = row(&pool, job_id).await.error.unwrap();
    assert!(
        error.contains("500") && error.contains("a 45-byte body (text/plain"),
        "{error}"
    );
    assert!(
        !error.contains("broken") && !error.contains("s3cret"),
        "{error}"
    );
    // Kept: without the NUL and the URL's credentials.
    let job_id = run_once_against(&engine, "http-kept", "nul-error").await;
    let error = row(&pool, job_id).await.error.unwrap();
    assert!(
        error.contains("500") && error.contains("broken \u{FFFD} see https://***@db.internal/x"),
        "{error}"
    );
    assert!(!error.contains("s3cret"), "{error}");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_body_over_the_cap_and_a_redirect_are_defects(pool: PgPool) {
    let engine = hostile_engine(&pool).await;
    let big = run_once_against(&engine, "http", "big").await;
    let error = row(&pool, big).await.error.unwrap();
    assert!(
        error.contains(&format!("over the limit of {LIMIT}")),
        "{error}"
    );
    let redirected = run_once_against(&engine, "http", "redirect").await;
    let error = row(&pool, redirected).await.error.unwrap();
    assert!(error.contains("307"), "not followed, a defect: {error}");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_request_that_cannot_be_built_is_a_defect_not_a_retry(pool: PgPool) {
    let engine = hostile_engine(&pool).await;
    // The step name goes into the Idempotency-Key header, where a newline
    // can never be sent.
    let workflow = json!({"name": "unsendable", "input_schema": {},
        "steps": [{"name": "bad\nname", "target": "http", "method": "ok"}]});
    engine.register_workflow(&workflow).await.unwrap();
    let job_id = submit(&engine, "unsendable", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let failed = row(&pool, job_id).await;
    assert_eq!(failed.attempt, 1);
    let error = failed.error.unwrap();
    assert!(error.contains("building the request"), "{error}");
}
