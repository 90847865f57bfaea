//! The HTTP server under the router: hyper's HTTP/1 with a bound on the
//! time to send a request's headers and on the connections held at once,
//! and graceful shutdown. A client that opens connections and sends
//! nothing (or a byte at a time) is cut off after the header timeout; past
//! the connection bound the server stops accepting until one closes (the
//! kernel's backlog then holds or refuses the rest). The time a whole
//! request may take is bounded in the router (`limit_time`).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::problem::Problem;

/// How long a client may take to send a request's headers, unless configured.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take, body included, unless configured.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections held open at once, unless configured.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// The health listener's bounds: probes and scrapers, a few at a time.
pub const HEALTH_LIMITS: ServerLimits = ServerLimits {
    header_read_timeout: Duration::from_secs(5),
    request_timeout: Duration::from_secs(10),
    max_connections: 64,
};

/// The server's bounds.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub header_read_timeout: Duration,
    pub request_timeout: Duration,
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Serves `router` on `listener` until `shutdown`, then lets the open
/// requests finish (the caller bounds how long).
///
/// # Errors
/// Never today; kept for the caller's supervision.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the permits are never closed"),
            () = shutdown.cancelled() => break,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, a connection reset before
                    // it was accepted: the world, not one request. Wait a
                    // little rather than spin.
                    tracing::warn!(error = %e, "accepting an API connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "an API connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Answers 503 when a request takes longer than the request timeout (the
/// handler is dropped: what it wrote in the database stays, and the
/// client can ask again with the same job id).
pub(crate) async fn limit_time(
    State(limit): State<Duration>,
    mut request: Request,
    next: Next,
) -> Response {
    // Long polls bound their waits by it (`waits.rs`).
    request
        .extensions_mut()
        .insert(crate::jobs::RequestDeadline(
            tokio::time::Instant::now() + limit,
        ));
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the request took longer than {} s", limit.as_secs_f64()),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use axum::middleware;
    use axum::routing::get;

    use super::*;

    #[tokio::test]
    async fn a_request_longer_than_the_timeout_is_answered_503_and_the_server_stops() {
        let router = Router::new()
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    "late"
                }),
            )
            .layer(middleware::from_fn_with_state(
                Duration::from_millis(100),
                limit_time,
            ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            router,
            ServerLimits::default(),
            stop.clone(),
        ));
        let client = flotilla_runtime::tls::http_client().build().unwrap();
        let response = client
            .get(format!("http://{address}/slow"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let problem: serde_json::Value = response.json().await.unwrap();
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("longer than 0.1 s"),
            "{problem}"
        );
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the server stops when told")
            .unwrap()
            .unwrap();
    }
}
