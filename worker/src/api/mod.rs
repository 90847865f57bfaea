//! The HTTP API on the worker (axum): the verbs of DESIGN.md under `/v1`
//! behind bearer tokens, and the open operational routes. Every error is
//! `application/problem+json`; without a database the API still answers,
//! with 503 and the reason.

mod auth;
mod jobs;
pub mod problem;
mod workflows;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post, put};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use auth::Tokens;

use crate::engine::Engine;
use problem::Problem;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct ApiState {
    pub engine: Engine,
    /// Broker checked by `/readyz`; `None` skips the check.
    pub bootstrap_servers: Option<String>,
}

/// Request bodies above this are refused with 413, unless configured otherwise.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// The whole router.
pub fn router(state: ApiState, tokens: Tokens, body_limit: usize) -> Router {
    // Install the recorder before any counter is touched, so none is lost.
    let _ = prometheus();
    let v1 = Router::new()
        .route("/jobs", post(jobs::submit).get(jobs::list))
        .route("/jobs/{job_id}", get(jobs::get))
        .route(
            "/jobs/{job_id}/steps/{step_name}/complete",
            post(jobs::complete),
        )
        .route("/jobs/{job_id}/retry", post(jobs::retry))
        .route("/jobs/{job_id}/cancel", post(jobs::cancel))
        .route("/workflows", get(workflows::list))
        .route("/workflows/{name}", put(workflows::put).get(workflows::get))
        .route_layer(middleware::from_fn_with_state(tokens, auth::require_token));
    Router::new()
        .nest("/v1", v1)
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({ "status": "ok" })) }),
        )
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { Problem::not_found("no such route") })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// Ready when the database and (if configured) the broker answer.
async fn readyz(State(state): State<ApiState>) -> Result<axum::Json<serde_json::Value>, Problem> {
    let database = tokio::time::timeout(
        Duration::from_secs(2),
        sqlx::query("SELECT 1").execute(state.engine.pool()),
    )
    .await;
    match database {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(Problem::unavailable(&e)),
        Err(_) => {
            return Err(Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "database did not answer within 2 s",
            ));
        }
    }
    if let Some(bootstrap) = &state.bootstrap_servers {
        crate::kafka::check_reachable(bootstrap, Duration::from_secs(2))
            .await
            .map_err(|e| {
                Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("broker unavailable: {e:#}"),
                )
            })?;
    }
    Ok(axum::Json(json!({ "status": "ready" })))
}

/// The process's Prometheus recorder, installed on first use (once per process).
fn prometheus() -> Option<&'static metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            match metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() {
                Ok(handle) => Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "no Prometheus recorder: another one is installed");
                    None
                }
            }
        })
        .as_ref()
}

/// Prometheus text exposition of the process's metrics.
async fn metrics() -> Result<([(axum::http::HeaderName, &'static str); 1], String), Problem> {
    let handle = prometheus().ok_or_else(|| {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder unavailable",
        )
    })?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        handle.render(),
    ))
}

/// Serves `router` on `listener` until `shutdown`.
///
/// # Errors
/// The server failed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Tokens from a comma-separated list, blanks dropped.
#[must_use]
pub fn tokens_from(list: &str) -> Tokens {
    Tokens(Arc::new(
        list.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect(),
    ))
}
