//! The `http` target: POST `<base_url>/<method>` with the JSON request,
//! over HTTPS with the system's roots plus an optional CA file, optional
//! client certificate and configured headers (sent, never shown).
//!
//! Classification (DESIGN.md): 2xx JSON is the response; connection failures
//! (retry class `transport`), timeouts (`timeout`), 408, 429, 502, 503 and
//! 504 (`status`) are retryable; so are 401 and 407 (`status`): refused
//! credentials are the worker's configuration (a rotated or wrong secret),
//! which an operator fixes while the jobs wait, not a fault of the request.
//! 422 with a `violations` list is a verdict; any other answer is a defect
//! (403 too: this request, with credentials that were accepted, is not
//! allowed), and so is a TLS certificate the worker refuses (retrying would
//! not change it).

use std::path::PathBuf;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;

use super::{RetryClass, StepFailure, Target, TargetCall};

/// The largest response body read from a target, unless configured.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 10 * 1024 * 1024;

#[derive(Debug)]
pub struct HttpTarget {
    base_url: String,
    client: reqwest::Client,
    max_response_bytes: usize,
}

/// How to reach an HTTPS target beyond the system's defaults.
#[derive(Debug, Clone, Default)]
pub struct HttpTls {
    /// PEM file of extra certificate authorities (added to the system's roots).
    pub ca_file: Option<PathBuf>,
    /// PEM certificate and private key presented to the target (mutual TLS).
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// Accept any certificate. For a test bench only: anyone on the path
    /// can read and change the calls.
    pub insecure_skip_verify: bool,
}

impl HttpTarget {
    /// A target at `base_url`; `timeout` bounds each call (a backstop to the
    /// engine's timers); a response body above `max_response_bytes` is a
    /// defect. Redirects are not followed: a target that redirects broke its
    /// contract (and following one would turn a POST into a GET).
    ///
    /// # Errors
    /// The base URL is not http(s), or the client cannot be built.
    pub fn new(
        base_url: &str,
        timeout: Duration,
        max_response_bytes: usize,
    ) -> Result<Self, String> {
        Self::configured(
            base_url,
            timeout,
            max_response_bytes,
            &HttpTls::default(),
            HeaderMap::new(),
        )
    }

    /// As [`HttpTarget::new`], with TLS settings and headers sent on every
    /// call (marked sensitive: never in logs or `Debug` output).
    ///
    /// # Errors
    /// The base URL is not http(s), a TLS file cannot be used, or the client
    /// cannot be built.
    pub fn configured(
        base_url: &str,
        timeout: Duration,
        max_response_bytes: usize,
        tls: &HttpTls,
        mut headers: HeaderMap,
    ) -> Result<Self, String> {
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(format!("base_url {base_url:?} is not an http(s) URL"));
        }
        for value in headers.values_mut() {
            value.set_sensitive(true);
        }
        let mut client = flotilla_runtime::tls::http_client()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .default_headers(headers);
        if let Some(ca) = &tls.ca_file {
            let roots =
                flotilla_runtime::tls::certificates(ca).map_err(|e| format!("ca_file: {e}"))?;
            client = client.tls_certs_merge(roots);
        }
        if let Some((certificate, key)) = &tls.client_identity {
            let identity = flotilla_runtime::tls::identity(certificate, key)
                .map_err(|e| format!("client_certificate: {e}"))?;
            client = client.identity(identity);
        }
        if tls.insecure_skip_verify {
            client = client.tls_danger_accept_invalid_certs(true);
        }
        let client = client.build().map_err(|e| error_chain(&e))?;
        Ok(Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            client,
            max_response_bytes,
        })
    }
}

/// An error and its causes in one line (reqwest's own message stops at
/// "error sending request").
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        let next = error.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = error.source();
    }
    text
}

#[async_trait::async_trait]
impl Target for HttpTarget {
    async fn call(&self, call: TargetCall) -> Result<serde_json::Value, StepFailure> {
        let url = format!("{}/{}", self.base_url, call.method.trim_start_matches('/'));
        let mut request = self
            .client
            .post(&url)
            // The engine enforces `call.timeout`; this is only a backstop.
            .timeout(call.timeout + Duration::from_secs(1))
            .header("Idempotency-Key", call.idempotency_key())
            .json(&call.request);
        if let Some(traceparent) = &call.traceparent {
            request = request.header("traceparent", traceparent);
        }
        if let Some(tracestate) = &call.tracestate {
            request = request.header("tracestate", tracestate);
        }
        let response = request.send().await.map_err(|e| {
            if e.is_builder() {
                // The request itself cannot be built (a header value, the
                // URL): the same call would fail the same way.
                StepFailure::Defect(format!("POST {url}: building the request: {e}"))
            } else if flotilla_runtime::tls::is_certificate_refused(&e) {
                StepFailure::Defect(format!(
                    "POST {url}: the target's TLS certificate was refused (set its ca_file?): {}",
                    error_chain(&e)
                ))
            } else {
                let class = if e.is_timeout() {
                    RetryClass::Timeout
                } else {
                    RetryClass::Transport
                };
                StepFailure::retryable(class, format!("POST {url}: {}", error_chain(&e)))
            }
        })?;
        let status = response.status();
        let body = read_capped(response, self.max_response_bytes, &url).await?;
        classify(&url, status, &body)
    }
}

/// The body, refused as a defect once it passes `limit` (announced or read).
async fn read_capped(
    mut response: reqwest::Response,
    limit: usize,
    url: &str,
) -> Result<Vec<u8>, StepFailure> {
    let too_large = |size: String| {
        StepFailure::Defect(format!(
            "POST {url}: the response body is {size} bytes, over the limit of {limit}"
        ))
    };
    if let Some(announced) = response.content_length()
        && usize::try_from(announced).map_or(true, |n| n > limit)
    {
        return Err(too_large(announced.to_string()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| {
        let class = if e.is_timeout() {
            RetryClass::Timeout
        } else {
            RetryClass::Transport
        };
        StepFailure::retryable(class, format!("POST {url}: reading the body: {e}"))
    })? {
        if body.len() + chunk.len() > limit {
            return Err(too_large(format!("more than {}", body.len() + chunk.len())));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn classify(url: &str, status: StatusCode, body: &[u8]) -> Result<serde_json::Value, StepFailure> {
    let text = || String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
    if status.is_success() {
        return serde_json::from_slice(body).map_err(|e| {
            StepFailure::Defect(format!(
                "POST {url}: {status} with a body that is not JSON ({e}): {}",
                text()
            ))
        });
    }
    match status.as_u16() {
        408 | 429 | 502 | 503 | 504 => Err(StepFailure::retryable(
            RetryClass::Status,
            format!("POST {url}: {status}: {}", text()),
        )),
        // The target (or a proxy) refused the worker's credentials: every
        // job of this target would meet the same until the secret is fixed.
        401 | 407 => Err(StepFailure::retryable(
            RetryClass::Status,
            format!(
                "POST {url}: {status} (check the target's credentials): {}",
                text()
            ),
        )),
        422 => {
            let violations = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|doc| doc.get("violations").and_then(|v| v.as_array()).cloned());
            match violations {
                Some(list) => {
                    let violations: Vec<String> = list
                        .iter()
                        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                        .collect();
                    Err(StepFailure::Verdict {
                        message: format!("POST {url}: 422: {}", violations.join("; ")),
                        violations,
                    })
                }
                None => Err(StepFailure::Defect(format!(
                    "POST {url}: 422 without a violations list: {}",
                    text()
                ))),
            }
        }
        _ => Err(StepFailure::Defect(format!(
            "POST {url}: {status}: {}",
            text()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_failure_classes() {
        let url = "http://t/m";
        assert!(classify(url, StatusCode::OK, b"{\"a\":1}").is_ok());
        assert!(matches!(
            classify(url, StatusCode::OK, b"nope"),
            Err(StepFailure::Defect(_))
        ));
        // 401 and 407: the credentials were refused, which an operator
        // fixes; the jobs back off and retry meanwhile.
        for code in [401, 407, 408, 429, 502, 503, 504] {
            let status = StatusCode::from_u16(code).unwrap();
            assert!(
                matches!(
                    classify(url, status, b""),
                    Err(StepFailure::Retryable {
                        class: RetryClass::Status,
                        ..
                    })
                ),
                "{code}"
            );
        }
        // 403: credentials accepted, this request refused.
        for code in [400, 403, 404, 409, 500] {
            let status = StatusCode::from_u16(code).unwrap();
            assert!(
                matches!(classify(url, status, b""), Err(StepFailure::Defect(_))),
                "{code}"
            );
        }
        let verdict = classify(
            url,
            StatusCode::UNPROCESSABLE_ENTITY,
            br#"{"violations":["too young"]}"#,
        );
        assert_eq!(
            verdict,
            Err(StepFailure::Verdict {
                message: "POST http://t/m: 422: too young".into(),
                violations: vec!["too young".into()]
            })
        );
        assert!(matches!(
            classify(url, StatusCode::UNPROCESSABLE_ENTITY, b"{}"),
            Err(StepFailure::Defect(_))
        ));
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_transport_retry_and_a_silent_target_a_timeout() {
        let call = |timeout| TargetCall {
            job_id: uuid::Uuid::new_v4(),
            step_name: "s".into(),
            method: "m".into(),
            request: serde_json::json!({}),
            timeout,
            traceparent: None,
            tracestate: None,
        };
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let refused = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let target = HttpTarget::new(&refused, Duration::from_secs(5), 1024).unwrap();
        let failure = target.call(call(Duration::from_secs(5))).await;
        assert!(
            matches!(
                failure,
                Err(StepFailure::Retryable {
                    class: RetryClass::Transport,
                    ..
                })
            ),
            "{failure:?}"
        );
        // Accepts the connection and never answers: the client's own timer.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", silent.local_addr().unwrap());
        let target = HttpTarget::new(&url, Duration::from_millis(100), 1024).unwrap();
        let failure = target.call(call(Duration::ZERO)).await;
        assert!(
            matches!(
                failure,
                Err(StepFailure::Retryable {
                    class: RetryClass::Timeout,
                    ..
                })
            ),
            "{failure:?}"
        );
        drop(silent);
    }
}
