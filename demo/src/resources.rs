//! The demo target's resources, for the workflows that shape their calls
//! (`returns`, `export`): orders read with `GET`, updated with `PUT` and
//! released with `DELETE`, each asking for the API key the targets file
//! keeps as a secret; and exports that become ready on their third poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use serde_json::json;

/// The key the `crm` target's `orders_key` secret holds in the demo's
/// targets files.
pub const API_KEY: &str = "demo-orders-key";

/// How many polls an export answers `running` before `ready`.
const RUNNING_POLLS: u64 = 2;

#[derive(Clone, Default)]
struct Exports(Arc<Mutex<HashMap<String, u64>>>);

/// The routes, beside the target's `POST /{method}`.
pub fn routes() -> axum::Router {
    axum::Router::new()
        .route("/orders/{id}", get(read_order).put(update_order))
        .route("/orders/{id}/reservation", delete(release_order))
        .route("/exports/{id}", get(poll_export))
        .with_state(Exports::default())
}

/// 401 unless the request carries the API key.
fn refused(headers: &HeaderMap) -> Option<Response> {
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    (key != Some(API_KEY)).then(|| {
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "a wrong or missing X-Api-Key"})),
        )
            .into_response()
    })
}

async fn read_order(Path(id): Path<String>, uri: Uri, headers: HeaderMap) -> Response {
    if let Some(refused) = refused(&headers) {
        return refused;
    }
    let mut order = json!({"id": id, "status": "delivered"});
    let expand = uri
        .query()
        .is_some_and(|query| query.split('&').any(|pair| pair == "expand=lines"));
    if expand {
        order["lines"] = json!([{"sku": "sku-1", "qty": 2}, {"sku": "sku-2", "qty": 1}]);
    }
    Json(order).into_response()
}

/// Answers in plain text: a step's response may be a string.
async fn update_order(headers: HeaderMap) -> Response {
    refused(&headers).unwrap_or_else(|| "updated".into_response())
}

/// Answers 204 with no body: a step's response is then null.
async fn release_order(headers: HeaderMap) -> Response {
    refused(&headers).unwrap_or_else(|| StatusCode::NO_CONTENT.into_response())
}

async fn poll_export(State(exports): State<Exports>, Path(id): Path<String>) -> Response {
    let polls = {
        let mut counts = exports.0.lock().unwrap();
        let n = counts.entry(id.clone()).or_default();
        *n += 1;
        *n
    };
    if polls <= RUNNING_POLLS {
        Json(json!({"id": id, "status": "running"})).into_response()
    } else {
        Json(json!({"id": id, "status": "ready", "url": format!("https://files.example/{id}.csv")}))
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(key: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", key.parse().unwrap());
        headers
    }

    #[tokio::test]
    async fn orders_need_the_key_and_exports_are_ready_on_the_third_poll() {
        let uri = |query: &str| format!("/orders/A-1%2Fx?{query}").parse::<Uri>().unwrap();
        let read = read_order(Path("A-1/x".into()), uri("expand=lines"), keyed(API_KEY)).await;
        assert_eq!(read.status(), StatusCode::OK);
        let body = axum::body::to_bytes(read.into_body(), 1024).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (body["id"].as_str(), body["lines"].as_array().map(Vec::len)),
            (Some("A-1/x"), Some(2))
        );
        let wrong = read_order(Path("A-1".into()), uri(""), keyed("guess")).await;
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            release_order(keyed(API_KEY)).await.status(),
            StatusCode::NO_CONTENT
        );
        let exports = Exports::default();
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let answer = poll_export(State(exports.clone()), Path("e1".into())).await;
            let body = axum::body::to_bytes(answer.into_body(), 1024)
                .await
                .unwrap();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            statuses.push(body["status"].as_str().unwrap().to_owned());
        }
        assert_eq!(statuses, ["running", "running", "ready"]);
    }
}
