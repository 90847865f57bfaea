//! The `http` target: POST `<base_url>/<method>` with the JSON request.
//!
//! Classification (DESIGN.md): 2xx JSON is the response; connection failures,
//! timeouts, 408, 429, 502, 503 and 504 are retryable; 422 with a
//! `violations` list is a verdict; any other answer is a defect.

use std::time::Duration;

use reqwest::StatusCode;

use super::{StepFailure, Target, TargetCall};

/// The largest response body read from a target, unless configured.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 10 * 1024 * 1024;

#[derive(Debug)]
pub struct HttpTarget {
    base_url: String,
    client: reqwest::Client,
    max_response_bytes: usize,
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
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(format!("base_url {base_url:?} is not an http(s) URL"));
        }
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            client,
            max_response_bytes,
        })
    }
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
        let response = request.send().await.map_err(|e| {
            if e.is_builder() {
                // The request itself cannot be built (a header value, the
                // URL): the same call would fail the same way.
                StepFailure::Defect(format!("POST {url}: building the request: {e}"))
            } else {
                StepFailure::Retryable(format!("POST {url}: {e}"))
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
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| StepFailure::Retryable(format!("POST {url}: reading the body: {e}")))?
    {
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
        408 | 429 | 502 | 503 | 504 => Err(StepFailure::Retryable(format!(
            "POST {url}: {status}: {}",
            text()
        ))),
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
        for code in [408, 429, 502, 503, 504] {
            let status = StatusCode::from_u16(code).unwrap();
            assert!(
                matches!(classify(url, status, b""), Err(StepFailure::Retryable(_))),
                "{code}"
            );
        }
        for code in [400, 401, 404, 409, 500] {
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
}
