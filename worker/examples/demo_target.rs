//! A tiny HTTP service for the demo (`scripts/demo`): the kind of target a
//! workflow step calls. `POST /lookup` finds a customer, `POST /score` scores
//! it; both answer JSON and log the `Idempotency-Key` they were sent.
//!
//! `cargo run -p flotilla-worker --example demo_target -- 127.0.0.1:18090`

use axum::Json;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18090".into());
    let app = axum::Router::new()
        .route(
            "/lookup",
            post(
                |headers: HeaderMap, Json(request): Json<Value>| async move {
                    log("lookup", &headers, &request);
                    let name = request["name"].as_str().unwrap_or("nobody").to_owned();
                    Json(json!({ "customer": { "name": name, "since": 2019, "country": "NL" } }))
                },
            ),
        )
        .route(
            "/score",
            post(
                |headers: HeaderMap, Json(request): Json<Value>| async move {
                    log("score", &headers, &request);
                    let since = request["since"].as_i64().unwrap_or(2026);
                    Json(json!({ "score": (2026 - since) * 10 + 40 }))
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("demo target listening on http://{address}");
    axum::serve(listener, app).await?;
    Ok(())
}

fn log(method: &str, headers: &HeaderMap, request: &Value) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    println!("demo target: {method} {request} (Idempotency-Key {key})");
}
