//! The HTTP API on the worker (axum): the verbs of the contract (docs/architecture.md) under `/v1`
//! behind bearer tokens, and the open operational routes. Every error is
//! `application/problem+json`; without a database the API still answers,
//! with 503 and the reason.

mod auth;
mod console;
mod errors;
mod fleet;
mod jobs;
pub mod openapi;
mod ops;
pub mod problem;
pub mod readiness;
pub mod views;
mod workflows;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post, put};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use auth::Tokens;

use crate::consumer::lag::LagReader;
use crate::engine::Engine;
use problem::Problem;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct ApiState {
    pub engine: Engine,
    /// What `/readyz` reads, kept fresh in the background.
    pub readiness: readiness::Readiness,
    /// Where the request consumers' lag is read for `/v1/fleet`; `None`
    /// when this worker consumes no requests.
    pub lag: Option<LagReader>,
}

/// Request bodies above this are refused with 413, unless configured otherwise.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// The whole router.
pub fn router(state: ApiState, tokens: Tokens, body_limit: usize) -> Router {
    // Install the recorder before any counter is touched, so none is lost.
    let _ = ops::prometheus();
    let v1 = Router::new()
        .route("/jobs", post(jobs::submit).get(jobs::list))
        .route("/jobs/{job_id}", get(jobs::get))
        .route("/jobs/{job_id}/events", get(jobs::events))
        .route(
            "/jobs/{job_id}/steps/{step_name}/complete",
            post(jobs::complete),
        )
        .route("/jobs/{job_id}/retry", post(jobs::retry))
        .route("/jobs/{job_id}/cancel", post(jobs::cancel))
        .route("/workflows", get(workflows::list))
        .route("/workflows/{name}", put(workflows::put).get(workflows::get))
        .route("/workflows/{name}/versions", get(workflows::versions))
        .route("/fleet", get(fleet::fleet))
        .route_layer(middleware::from_fn_with_state(tokens, auth::require_token))
        .route_layer(middleware::from_fn(console::refuse_cross_site));
    Router::new()
        .nest("/v1", v1)
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .merge(console::routes())
        .fallback(|| async { Problem::not_found("no such route") })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
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
