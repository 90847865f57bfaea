//! The open operational routes: health, readiness, metrics, the API document.

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use serde_json::{Value, json};

use crate::ApiState;
use crate::auth::Granted;
use crate::problem::{Problem, ProblemDoc};

/// Alive (the process answers).
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "`{status: ok}`")))]
pub(crate) async fn healthz() -> axum::Json<Value> {
    axum::Json(json!({ "status": "ok" }))
}

/// Ready when the database answered a recent ping, every supervised task
/// runs, and the request consumer is not paused past its bound: read from
/// state kept in the background (`readiness.rs`), so a probe opens no
/// connection of any kind. The reasons for not being ready (which name
/// hosts and errors) only go to a caller with an API token.
#[utoipa::path(get, path = "/readyz", responses((status = 200, description = "`{status: ready}`"), (status = 503, description = "not ready; with an API token, the reasons (database unavailable, a task not running, the consumer paused too long)", body = ProblemDoc, content_type = "application/problem+json")))]
pub(crate) async fn readyz(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<axum::Json<serde_json::Value>, Problem> {
    let problems = state.readiness.problems();
    if problems.is_empty() {
        return Ok(axum::Json(json!({ "status": "ready" })));
    }
    let detail = match state.tokens.granted(&headers) {
        Ok(Some(_)) => problems.join("; "),
        _ => "not ready".to_owned(),
    };
    Err(Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail))
}

/// What the caller's token may do: the console shows only that.
#[utoipa::path(get, path = "/v1/me", responses((status = 200, description = "`{scopes: [...], auth: bool}`: the token's scopes, and whether this worker checks tokens at all")), security(("bearer" = [])))]
pub(crate) async fn who_am_i(
    State(state): State<ApiState>,
    Extension(Granted(scopes)): Extension<Granted>,
) -> axum::Json<Value> {
    axum::Json(json!({
        "scopes": scopes.names(),
        "auth": !state.tokens.is_empty(),
    }))
}

/// The process's Prometheus recorder (see `flotilla_runtime::metrics`).
pub(crate) fn prometheus() -> Option<&'static metrics_exporter_prometheus::PrometheusHandle> {
    flotilla_runtime::metrics::prometheus()
}

/// Prometheus text exposition of the process's metrics.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub(crate) async fn metrics(
    State(state): State<ApiState>,
) -> Result<([(HeaderName, &'static str); 1], String), Problem> {
    // Gauges read at scrape time: what the pool and the supervised tasks
    // are doing now.
    let pool = state.engine.pool();
    let idle = pool.num_idle();
    #[allow(clippy::cast_precision_loss)]
    {
        metrics::gauge!("flotilla_db_pool_connections", "state" => "idle").set(idle as f64);
        metrics::gauge!("flotilla_db_pool_connections", "state" => "in_use")
            .set(f64::from(pool.size()) - idle as f64);
        metrics::gauge!("flotilla_tasks_dead").set(state.engine.health().problems().len() as f64);
    }
    // Timers: a query on a partial index of the sleeping jobs only. A
    // database that does not answer leaves the gauges as they were.
    match state.engine.timer_backlog().await {
        Ok((sleeping, overdue)) => {
            #[allow(clippy::cast_precision_loss)]
            metrics::gauge!("flotilla_timers_pending").set(sleeping as f64);
            metrics::gauge!("flotilla_timer_oldest_overdue_seconds")
                .set(overdue.map_or(0.0, |d| d.as_secs_f64()));
        }
        Err(e) => tracing::warn!(error = %e, "reading the timer backlog for the metrics failed"),
    }
    let handle = prometheus().ok_or_else(|| {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder unavailable",
        )
    })?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    ))
}
