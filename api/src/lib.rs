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
mod schedules;
pub mod server;
mod signals;
pub mod views;
mod workflows;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post, put};

pub use auth::{ROUTE_SCOPES, Scope, Scopes, Tokens, WHO_AM_I};
pub use console::ServedHosts;
pub use server::{ServerLimits, serve};

use flotilla_engine::Engine;
use flotilla_runtime::kafka::lag::LagReader;
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
    /// The API tokens: `/readyz` shows its reasons only to a holder of one.
    pub tokens: Tokens,
    /// Whether submissions may carry inline definitions at all.
    pub inline_definitions: bool,
}

/// The router's settings.
#[derive(Debug, Clone)]
pub struct RouterSettings {
    /// Request bodies above this are refused with 413.
    pub body_limit: usize,
    /// Longer requests are answered 503.
    pub request_timeout: std::time::Duration,
    /// The `Host` names `/v1` answers to (DNS rebinding, `console.rs`).
    pub hosts: ServedHosts,
}

/// Request bodies above this are refused with 413, unless configured otherwise.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// The probes' and scrapers' router, for a listener of their own
/// (`FLOTILLA_HEALTH_ADDR`): the API's clients cannot take its seats.
pub fn health_router(state: ApiState) -> Router {
    let _ = ops::prometheus();
    Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .fallback(|| async { Problem::not_found("no such route") })
        .layer(middleware::from_fn_with_state(
            server::HEALTH_LIMITS.request_timeout,
            server::limit_time,
        ))
        .with_state(state)
}

/// The whole router.
pub fn router(state: ApiState, settings: RouterSettings) -> Router {
    // Install the recorder before any counter is touched, so none is lost.
    let _ = ops::prometheus();
    let v1 = Router::new()
        .route("/jobs", post(jobs::submit).get(jobs::list))
        .route("/jobs/{job_id}", get(jobs::get))
        .route("/jobs/{job_id}/events", get(jobs::events))
        .route("/jobs/{job_id}/graph", get(jobs::graph))
        .route("/jobs/{job_id}/graft", post(jobs::graft))
        .route(
            "/jobs/{job_id}/signals",
            post(signals::send).get(signals::list),
        )
        .route(
            "/jobs/{job_id}/steps/{step_name}/complete",
            post(jobs::complete),
        )
        .route("/jobs/bulk/retry", post(jobs::bulk::retry))
        .route("/jobs/bulk/cancel", post(jobs::bulk::cancel))
        .route("/jobs/{job_id}/retry", post(jobs::retry))
        .route("/jobs/{job_id}/cancel", post(jobs::cancel))
        .route("/workflows", get(workflows::list))
        .route("/workflows/{name}", put(workflows::put).get(workflows::get))
        .route("/workflows/{name}/versions", get(workflows::versions))
        .route("/schedules", get(schedules::list))
        .route(
            "/schedules/{name}",
            put(schedules::put)
                .get(schedules::get)
                .delete(schedules::delete),
        )
        .route("/schedules/{name}/pause", post(schedules::pause))
        .route("/schedules/{name}/resume", post(schedules::resume))
        .route("/fleet", get(fleet::fleet))
        .route(auth::WHO_AM_I.trim_start_matches("/v1"), get(ops::who_am_i))
        .route_layer(middleware::from_fn_with_state(
            state.tokens.clone(),
            auth::require_token,
        ))
        .route_layer(middleware::from_fn_with_state(
            settings.hosts,
            console::refuse_cross_site,
        ));
    Router::new()
        .nest("/v1", v1)
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(openapi::openapi))
        .merge(console::routes())
        .fallback(|| async { Problem::not_found("no such route") })
        .layer(DefaultBodyLimit::max(settings.body_limit))
        .layer(middleware::from_fn_with_state(
            settings.request_timeout,
            server::limit_time,
        ))
        .with_state(state)
}
