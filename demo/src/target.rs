//! The demo target: an HTTP service like the ones workflow steps call. Each
//! method shows one behaviour of the fleet:
//!
//! - `lookup`, `score`, `label`, `authorize`: answer at once (after the
//!   latency knob);
//! - `capture`, the payment's second step: answers 503 to the first call of
//!   each job (a transient failure), then succeeds. The retry resumes from
//!   the checkpoint `authorize` left, so `authorize` is called once and
//!   `capture` twice: the target counts the payment calls per job and step,
//!   and `capture`'s answer carries them (`calls`) into the job's
//!   checkpoints, where the demo driver checks them;
//! - `check`: a verdict (422 with violations) for an applicant under 18;
//! - `archive`: always 503, so its jobs run out of attempts and go DEAD;
//! - `exports`: begins an export, polled at `GET /exports/{id}`; that and
//!   the orders (`GET`, `PUT`, `DELETE`) are `crate::resources`.
//!
//! With `DEMO_TARGET_KAFKA_REQUESTS` it also answers step requests on that
//! topic (`crate::responder`).
//!
//! Knobs: `DEMO_TARGET_LATENCY` delays every answer; `DEMO_TARGET_FAILURE_RATE`
//! answers that share of all calls 503 (0 by default, so the demo's counts
//! are exact).

use std::collections::{BTreeMap, HashMap};
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
    /// Kafka mode as well: answer the step requests on this topic (the
    /// `fraud` target of `demo/targets.yaml`; see `responder`). Unset: HTTP only.
    #[arg(long, env = "DEMO_TARGET_KAFKA_REQUESTS")]
    pub kafka_requests: Option<String>,
    /// The broker of Kafka mode.
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    pub kafka_bootstrap_servers: String,
    /// Kafka mode's replies in Avro through this registry; JSON without.
    #[arg(long, env = "SCHEMA_REGISTRY_URL")]
    pub schema_registry_url: Option<String>,
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
    /// Calls per job and step, of the counted methods only: a long-running
    /// target keeps no count for the other calls.
    calls_by_job: Arc<Mutex<HashMap<String, BTreeMap<String, u64>>>>,
    calls: Arc<std::sync::atomic::AtomicU64>,
}

/// The methods whose calls are counted per job and step (the payment's,
/// and the fulfilment graph's: a `for_each` item counts under
/// `<step>:item-<n>`, its idempotency key's tail).
const COUNTED: [&str; 5] = ["authorize", "capture", "stock", "price", "dispatch"];

impl Shared {
    /// Counts a call with this idempotency key (`<job_id>:<step>`); returns
    /// how many calls that job and step have had, this one included.
    fn count(&self, key: &str) -> u64 {
        let (job, step) = key.split_once(':').unwrap_or((key, ""));
        let mut calls = self.calls_by_job.lock().unwrap();
        let n = calls
            .entry(job.to_owned())
            .or_default()
            .entry(step.to_owned())
            .or_default();
        *n += 1;
        *n
    }

    /// The calls counted so far for the job of this idempotency key, by step.
    fn calls_of_job(&self, key: &str) -> Value {
        let job = key.split_once(':').map_or(key, |(job, _)| job);
        json!(self.calls_by_job.lock().unwrap().get(job))
    }
}

/// The target's routes.
pub fn router(settings: &TargetSettings) -> axum::Router {
    let shared = Shared {
        latency: *settings.latency,
        failure_rate: settings.failure_rate,
        calls_by_job: Arc::default(),
        calls: Arc::default(),
    };
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/{method}", post(call))
        .with_state(shared)
        .merge(crate::resources::routes())
}

/// Serves until the process ends.
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(settings: TargetSettings) -> anyhow::Result<()> {
    if let Some(topic) = settings.kafka_requests.clone() {
        let broker = flotilla_runtime::BrokerConfig::new(&settings.kafka_bootstrap_servers);
        let codec = match &settings.schema_registry_url {
            Some(url) => flotilla_codec::Codec::with_registry(url)?,
            None => flotilla_codec::Codec::json(),
        };
        tokio::spawn(async move {
            if let Err(e) = crate::responder::respond(broker, codec, topic).await {
                eprintln!("demo target: Kafka mode stopped: {e}");
                std::process::exit(1);
            }
        });
    }
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
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // Counted before any injected failure: the counts are of every call.
    let nth = COUNTED
        .contains(&method.as_str())
        .then(|| shared.count(&key));
    let n = shared
        .calls
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if shared.failure_rate > 0.0 && sampled(n, shared.failure_rate) {
        return busy("injected failure (DEMO_TARGET_FAILURE_RATE)");
    }
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
        "authorize" => ok(json!({"authorization": "ok"})),
        "stock" => ok(json!({"available": request["skus"].as_array().map_or(0, Vec::len)})),
        "price" => ok(json!({"sku": request["sku"].clone(), "price": 5})),
        "dispatch" => ok(json!({"dispatched": true, "calls": shared.calls_of_job(&key)})),
        // An export begun: polled at `GET /exports/{id}` (`resources`).
        "exports" => {
            let job = key.split_once(':').map_or(key.as_str(), |(job, _)| job);
            ok(json!({"id": format!("export-{job}")}))
        }
        "capture" if nth == Some(1) => busy("the payment provider is busy; try again"),
        "capture" => ok(json!({
            "captured": request["amount"].clone(),
            "calls": shared.calls_of_job(&key),
        })),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Shared {
        Shared {
            latency: Duration::ZERO,
            failure_rate: 0.0,
            calls_by_job: Arc::default(),
            calls: Arc::default(),
        }
    }

    async fn post(shared: &Shared, method: &str, key: &str) -> Answer {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", key.parse().unwrap());
        call(
            State(shared.clone()),
            Path(method.to_owned()),
            headers,
            Json(json!({"amount": 7})),
        )
        .await
    }

    #[tokio::test]
    async fn capture_fails_once_per_job_and_reports_the_calls_of_its_job() {
        let shared = target();
        let (status, _) = post(&shared, "authorize", "job-1:authorize").await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = post(&shared, "capture", "job-1:capture").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let (status, Json(body)) = post(&shared, "capture", "job-1:capture").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body,
            json!({"captured": 7, "calls": {"authorize": 1, "capture": 2}})
        );
        // Another job starts its own count.
        let (status, _) = post(&shared, "capture", "job-2:capture").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
