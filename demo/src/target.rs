//! The demo target: an HTTP service like the ones workflow steps call. Each
//! method shows one behaviour of the fleet:
//!
//! - `lookup`, `score`, `label`, `capture`: answer at once (after the latency knob);
//! - `authorize`: answers 503 to the first call of each job (a transient
//!   failure the worker retries from its checkpoint), then succeeds;
//! - `check`: a verdict (422 with violations) for an applicant under 18;
//! - `archive`: always 503, so its jobs run out of attempts and go DEAD.
//!
//! Knobs: `DEMO_TARGET_LATENCY` delays every answer; `DEMO_TARGET_FAILURE_RATE`
//! answers that share of all calls 503 (0 by default, so the demo's counts
//! are exact).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// How the target behaves.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetSettings {
    /// Where to listen.
    #[arg(long, env = "DEMO_TARGET_ADDR", default_value = "0.0.0.0:8090")]
    pub addr: SocketAddr,
    /// Added to every answer.
    #[arg(long, env = "DEMO_TARGET_LATENCY", default_value = "5ms")]
    pub latency: humantime::Duration,
    /// Share of all calls answered 503 (transient), from 0 to 1.
    #[arg(long, env = "DEMO_TARGET_FAILURE_RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub failure_rate: f64,
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("{text} is not a share between 0 and 1")),
    }
}

#[derive(Clone)]
struct Shared {
    latency: Duration,
    failure_rate: f64,
    /// Jobs whose `authorize` already failed once.
    authorized_once: Arc<Mutex<HashSet<String>>>,
    calls: Arc<std::sync::atomic::AtomicU64>,
}

/// The target's routes.
pub fn router(settings: &TargetSettings) -> axum::Router {
    let shared = Shared {
        latency: *settings.latency,
        failure_rate: settings.failure_rate,
        authorized_once: Arc::default(),
        calls: Arc::default(),
    };
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/{method}", post(call))
        .with_state(shared)
}

/// Serves until the process ends.
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(settings: TargetSettings) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(settings.addr).await?;
    println!(
        "demo target listening on http://{} (latency {}, failure rate {})",
        listener.local_addr()?,
        settings.latency,
        settings.failure_rate
    );
    axum::serve(listener, router(&settings)).await?;
    Ok(())
}

type Answer = (StatusCode, Json<Value>);

async fn call(
    State(shared): State<Shared>,
    Path(method): Path<String>,
    headers: HeaderMap,
    Json(request): Json<Value>,
) -> Answer {
    tokio::time::sleep(shared.latency).await;
    let n = shared
        .calls
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if shared.failure_rate > 0.0 && sampled(n, shared.failure_rate) {
        return busy("injected failure (DEMO_TARGET_FAILURE_RATE)");
    }
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    match method.as_str() {
        "lookup" => {
            let name = request["name"].as_str().unwrap_or("nobody");
            ok(json!({"customer": {"name": name, "since": 2019, "country": "NL"}}))
        }
        "score" => {
            let since = request["since"].as_i64().unwrap_or(2026);
            ok(json!({"score": (2026 - since) * 10 + 40}))
        }
        "label" => ok(json!({"label": format!("PARCEL-{}", &key[..key.len().min(8)])})),
        "authorize" => {
            let first = shared.authorized_once.lock().unwrap().insert(key);
            if first {
                busy("the payment provider is busy; try again")
            } else {
                ok(json!({"authorization": "ok"}))
            }
        }
        "capture" => ok(json!({"captured": request["amount"].clone()})),
        "check" => {
            if request["age"].as_i64().is_some_and(|age| age < 18) {
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Json(json!({"violations": ["the applicant is under 18"]})),
                )
            } else {
                ok(json!({"checked": true}))
            }
        }
        "archive" => busy("the archive is down for maintenance"),
        other => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!("no method {other}")})),
        ),
    }
}

fn ok(body: Value) -> Answer {
    (StatusCode::OK, Json(body))
}

fn busy(why: &str) -> Answer {
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": why})))
}

/// Whether call `n` falls in the failing share (spread evenly, no RNG).
fn sampled(n: u64, rate: f64) -> bool {
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let every = (1.0 / rate).round().max(1.0) as u64;
    n.is_multiple_of(every)
}
