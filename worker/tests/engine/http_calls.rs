//! Steps that shape their HTTP call: a verb, a path with the job's values
//! in it, a query and headers with a secret of the target's, against a
//! real HTTP service; the call shown in checkpoints and the graph, never
//! the secret; a value that would walk out of the path fails its job
//! before any call.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::IntoResponse as _;
use axum::routing::get;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{Engine, Outcome};
use flotilla_worker::targets::Targets;
use flotilla_worker::targets::http::HttpTarget;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::{engine, events, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;
const SECRET: &str = "shop-s3cret-key";

/// What the service saw: verb, path and query, tenant, key, body.
type Seen = Arc<Mutex<Vec<(String, String, String, String, String)>>>;

/// Records the request, then answers a GET with JSON, a PUT with text
/// and anything else with 204.
async fn record(
    State(seen): State<Seen>,
    Path(id): Path<String>,
    request: Request,
) -> axum::response::Response {
    // In a block: a borrow of the request (its body is not Sync) must not
    // live across the await below.
    let (tenant, key) = {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        (header("x-tenant"), header("x-api-key"))
    };
    let verb = request.method().to_string();
    let uri = request.uri().to_string();
    let body = axum::body::to_bytes(request.into_body(), 1 << 16)
        .await
        .unwrap();
    let body = String::from_utf8(body.to_vec()).unwrap();
    seen.lock()
        .unwrap()
        .push((verb.clone(), uri, tenant, key, body));
    match verb.as_str() {
        "GET" => axum::Json(json!({"id": id, "status": "open"})).into_response(),
        "PUT" => "stored".into_response(),
        _ => StatusCode::NO_CONTENT.into_response(),
    }
}

async fn shop() -> (String, Seen) {
    let seen = Seen::default();
    let app = axum::Router::new()
        .route("/api/orders/{id}", get(record).put(record).delete(record))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

async fn shop_engine(pool: &PgPool) -> (Engine, Seen) {
    let (url, seen) = shop().await;
    let target = HttpTarget::new(&url, Duration::from_secs(5), 1 << 16)
        .unwrap()
        .secrets(BTreeMap::from([(
            "shop_key".to_owned(),
            axum::http::HeaderValue::from_static(SECRET),
        )]));
    let mut targets = Targets::default();
    targets.register("shop", Arc::new(target), 8);
    let engine = engine(pool, targets, manual_clock(), "w");
    engine
        .register_workflow(&json!({
            "name": "order-tidy", "input_schema": {},
            "steps": [
                {"name": "fetch", "target": "shop", "verb": "GET",
                 "path": "/orders/{input.order_id}",
                 "query": {"expand": "{input.expand}", "missing": "{input.nothing}"},
                 "headers": {"X-Tenant": "{input.tenant}", "X-Api-Key": "{secrets.shop_key}"}},
                {"name": "mark", "target": "shop", "verb": "PUT",
                 "path": "/orders/{input.order_id}",
                 "rules": ["status = steps.fetch.status + '-seen'"]},
                {"name": "remove", "target": "shop", "verb": "DELETE",
                 "path": "/orders/{input.order_id}"}
            ]
        }))
        .await
        .unwrap();
    (engine, seen)
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_step_gets_puts_and_deletes_a_resource_by_its_path_with_a_secret_header(pool: PgPool) {
    let (engine, seen) = shop_engine(&pool).await;
    let input = json!({"order_id": "A-17/x", "expand": "lines", "nothing": null, "tenant": "acme"});
    let job_id = submit(&engine, "order-tidy", input).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));

    let seen = seen.lock().unwrap().clone();
    let path = "/api/orders/A-17%2Fx";
    assert_eq!(
        seen,
        [
            (
                "GET".to_owned(),
                format!("{path}?expand=lines"),
                "acme".to_owned(),
                SECRET.to_owned(),
                String::new()
            ),
            (
                "PUT".to_owned(),
                path.to_owned(),
                String::new(),
                String::new(),
                r#"{"status":"open-seen"}"#.to_owned()
            ),
            (
                "DELETE".to_owned(),
                path.to_owned(),
                String::new(),
                String::new(),
                String::new()
            ),
        ]
    );
    let done = row(&pool, job_id).await;
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(
        done.reader_level,
        flotilla_store::runs::STEP_FORMS_READER_LEVEL
    );
    // The text answer is a string, the 204 a null.
    let checkpoints = done.checkpoints.0.as_array().unwrap().clone();
    let of = |name: &str| {
        checkpoints
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(of("mark")["response"], "stored");
    assert_eq!(of("fetch")["call"], "GET /orders/A-17%2Fx?expand=lines");
    let graph = flotilla_worker::engine::ops::graph_view::of(&done).unwrap();
    let calls: Vec<Option<String>> = graph.nodes.iter().map(|n| n.call.clone()).collect();
    assert_eq!(
        calls,
        [
            Some("GET /orders/A-17%2Fx?expand=lines".to_owned()),
            Some("PUT /orders/A-17%2Fx".to_owned()),
            Some("DELETE /orders/A-17%2Fx".to_owned())
        ]
    );
    // The secret is in no row and no event.
    let stored = serde_json::to_string(&(
        &done.checkpoints.0,
        &done.definition.0,
        &done.result,
        &done.error,
    ))
    .unwrap();
    let published = serde_json::to_string(&events(&pool, job_id).await).unwrap();
    assert!(!stored.contains(SECRET) && !published.contains(SECRET));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_value_that_would_leave_the_path_fails_its_job_before_any_call(pool: PgPool) {
    let (engine, seen) = shop_engine(&pool).await;
    for hostile in [json!(".."), json!(""), json!(["a"]), json!({"a": 1})] {
        let input = json!({"order_id": hostile, "expand": "lines", "tenant": "acme"});
        let job_id = submit(&engine, "order-tidy", input).await;
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
        let failed = row(&pool, job_id).await;
        let error = failed.error.unwrap_or_default();
        assert!(
            error.contains("step fetch: building the request: path:"),
            "{hostile}: {error}"
        );
        assert_eq!(failed.attempt, 1, "{hostile}: not retried");
    }
    let header_break =
        json!({"order_id": "1", "expand": "x", "nothing": null, "tenant": "acme\r\nX-Admin: 1"});
    let job_id = submit(&engine, "order-tidy", header_break).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let error = row(&pool, job_id).await.error.unwrap_or_default();
    assert!(error.contains("headers.X-Tenant"), "{error}");
    assert!(seen.lock().unwrap().is_empty(), "the target was called");
}
