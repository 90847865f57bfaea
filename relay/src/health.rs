//! The relay's operational routes, like the worker's: `/healthz` (the
//! process answers), `/readyz` (the database answers and the world is not
//! holding every row back) and `/metrics` (Prometheus text: rounds, buckets held, the age of
//! the oldest PENDING row, publish failures by class and reason). A small hyper server:
//! the relay carries no web framework.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What readiness looks at, shared with the relay's loop.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    rounds_failing: Arc<AtomicBool>,
    /// Why the failing rounds fail, when one reason is worth naming.
    failing_because: Arc<std::sync::Mutex<Option<String>>>,
    /// Why the event topic refuses writes, as start-up found it.
    topic_unfit: Arc<std::sync::Mutex<Option<String>>>,
    /// Why publishing stopped for good, until an operator acts.
    stopped: Arc<std::sync::Mutex<Option<String>>>,
}

impl Readiness {
    /// Records why publishing stopped (fewer partitions than recorded), or that
    /// it goes on (`None`).
    pub fn publishing_stopped(&self, reason: Option<String>) {
        *self
            .stopped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = reason;
    }

    fn stopped(&self) -> Option<String> {
        self.stopped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records whether the last read or marking failed (the database, or
    /// the world held back every row it marked).
    pub fn round_failed(&self, failed: bool) {
        self.rounds_failing.store(failed, Ordering::SeqCst);
        if !failed {
            self.failing_because(None);
        }
    }

    /// Records that the event topic refuses writes (fewer replicas than its
    /// `min.insync.replicas`), or that it does not (`None`).
    pub fn topic_unfit(&self, reason: Option<String>) {
        *self
            .topic_unfit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = reason;
    }

    /// Names why rounds fail (`None`: no reason worth naming).
    pub fn failing_because(&self, reason: Option<String>) {
        *self
            .failing_because
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = reason;
    }

    fn failing_reason(&self) -> String {
        self.failing_because
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "relay rounds are failing".to_owned())
    }
}

fn prometheus() -> Option<&'static PrometheusHandle> {
    flotilla_runtime::metrics::prometheus()
}

/// Binds `addr`, installs the metrics recorder and serves until `shutdown`.
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    pool: PgPool,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let _ = prometheus();
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "relay health listening");
    Ok(tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a health connection failed");
                        continue;
                    }
                },
                () = shutdown.cancelled() => return,
            };
            let (pool, readiness) = (pool.clone(), readiness.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let (pool, readiness) = (pool.clone(), readiness.clone());
                    async move { Ok::<_, Infallible>(route(&request, &pool, &readiness).await) }
                });
                let served = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                if let Err(e) = tokio::time::timeout(Duration::from_secs(30), served)
                    .await
                    .unwrap_or(Ok(()))
                {
                    tracing::debug!(error = %e, "health connection ended");
                }
            });
        }
    }))
}

async fn route(
    request: &Request<Incoming>,
    pool: &PgPool,
    readiness: &Readiness,
) -> Response<Full<Bytes>> {
    match request.uri().path() {
        "/healthz" => json(StatusCode::OK, r#"{"status":"ok"}"#.to_owned()),
        "/readyz" => ready(pool, readiness).await,
        "/metrics" => metrics(pool).await,
        _ => problem(StatusCode::NOT_FOUND, "no such route"),
    }
}

async fn ready(pool: &PgPool, readiness: &Readiness) -> Response<Full<Bytes>> {
    let database = tokio::time::timeout(
        Duration::from_secs(2),
        flotilla_store::sql::session(pool, async |conn| {
            flotilla_store::sql::query("SELECT 1").execute(conn).await
        }),
    )
    .await;
    if let Some(reason) = readiness.stopped() {
        return problem(StatusCode::SERVICE_UNAVAILABLE, &reason);
    }
    let unfit = readiness
        .topic_unfit
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    if let Some(reason) = unfit {
        return problem(StatusCode::SERVICE_UNAVAILABLE, &reason);
    }
    match database {
        Ok(Ok(_)) if !readiness.rounds_failing.load(Ordering::SeqCst) => {
            json(StatusCode::OK, r#"{"status":"ready"}"#.to_owned())
        }
        Ok(Ok(_)) => problem(StatusCode::SERVICE_UNAVAILABLE, &readiness.failing_reason()),
        Ok(Err(e)) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("database unavailable: {e}"),
        ),
        Err(_) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "database did not answer within 2 s",
        ),
    }
}

async fn metrics(pool: &PgPool) -> Response<Full<Bytes>> {
    // The backlog is read when asked: one indexed query per scrape.
    if let Ok((pending, oldest)) = flotilla_store::outbox::backlog(pool).await {
        #[allow(clippy::cast_precision_loss)]
        metrics::gauge!("flotilla_outbox_pending").set(pending as f64);
        metrics::gauge!("flotilla_relay_oldest_pending_seconds").set(oldest);
    }
    match prometheus() {
        Some(handle) => {
            let mut response = Response::new(Full::new(Bytes::from(handle.render())));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            response
        }
        None => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder unavailable",
        ),
    }
}

fn json(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn problem(status: StatusCode, detail: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = json(status, body.to_string());
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/problem+json"),
    );
    response
}
