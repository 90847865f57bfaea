//! The `http` target: POST `<base_url>/<method>` with the JSON request,
//! or the step's own verb, path, query and headers (its call shape:
//! `flotilla_workflow::http`), over HTTPS with the system's roots plus an
//! optional CA file, optional client certificate and configured headers
//! and secrets (sent, never shown). `GET` and `DELETE` send no body.
//!
//! Classification (DESIGN.md): a 2xx answer is the response: its JSON, or
//! null for an empty body, or the text of a body that is not JSON and
//! does not claim to be (a JSON content type whose body does not parse is
//! a defect); connection failures
//! (retry class `transport`), timeouts (`timeout`), 408, 429, 502, 503 and
//! 504 (`status`) are retryable; so are 401 and 407 (`status`): refused
//! credentials are the worker's configuration (a rotated or wrong secret),
//! which an operator fixes while the jobs wait, not a fault of the request.
//! 422 with a `violations` list is a verdict; any other answer is a defect
//! (403 too: this request, with credentials that were accepted, is not
//! allowed), and so is a TLS certificate the worker refuses (retrying would
//! not change it).
//!
//! Containment: the URL is the base URL and a method checked to be one
//! plain segment (`flotilla_workflow::limits`), or a path whose text was
//! checked when its definition compiled and whose values are
//! percent-encoded (`flotilla_workflow::http`), so neither reaches another
//! host, and a path no parent directory. Error texts (which reach
//! rows and events) show the URL without its user info and query, and of a
//! failed answer's body only its length and content type unless the
//! operator keeps a prefix (`error_body_bytes`).

use std::path::PathBuf;
use std::time::Duration;

use std::collections::BTreeMap;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{StatusCode, Url};

use super::{RetryClass, StepFailure, Target, TargetCall};
use flotilla_workflow::Verb;
use flotilla_workflow::http::HeaderPiece;
use flotilla_workflow::limits;

/// How long after the engine's own step timeout the HTTP client gives up by
/// itself (only when the engine's timer could not fire).
const BACKSTOP_GRACE: Duration = Duration::from_secs(1);

/// The largest response body read from a target, unless configured.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 10 * 1024 * 1024;

#[derive(Debug)]
pub struct HttpTarget {
    base: Url,
    /// The base URL as error texts show it: no user info, no query.
    shown: String,
    /// The operator's bound on one call; a definition cannot raise it.
    timeout: Duration,
    client: reqwest::Client,
    max_response_bytes: usize,
    /// How much of a failed answer's body error texts keep.
    error_body_bytes: usize,
    /// Statuses this target's operator wants retried although they would
    /// be final (a service whose 500s are known to pass).
    retry_statuses: Vec<u16>,
    /// The verb of a step that names none.
    default_verb: Verb,
    /// Values steps' headers name as `{secrets.<name>}`.
    secrets: BTreeMap<String, HeaderValue>,
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
        let base = Url::parse(base_url)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https") && !url.cannot_be_a_base())
            .ok_or_else(|| format!("base_url {base_url:?} is not an http(s) URL"))?;
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
            shown: flotilla_runtime::redact::url(base.as_str()),
            base,
            timeout,
            client,
            max_response_bytes,
            error_body_bytes: 0,
            retry_statuses: Vec::new(),
            default_verb: Verb::Post,
            secrets: BTreeMap::new(),
        })
    }

    /// Uses `verb` for the steps that name none (`POST` unless set).
    #[must_use]
    pub fn default_verb(mut self, verb: Verb) -> Self {
        self.default_verb = verb;
        self
    }

    /// The values steps' headers may name as `{secrets.<name>}` (marked
    /// sensitive: never in logs or `Debug` output).
    #[must_use]
    pub fn secrets(mut self, secrets: BTreeMap<String, HeaderValue>) -> Self {
        self.secrets = secrets
            .into_iter()
            .map(|(name, mut value)| {
                value.set_sensitive(true);
                (name, value)
            })
            .collect();
        self
    }

    /// Keeps the first `bytes` of a failed answer's body in error texts
    /// (none by default: a body can hold what the job's readers should not
    /// see).
    #[must_use]
    pub fn keep_error_body(mut self, bytes: usize) -> Self {
        self.error_body_bytes = bytes;
        self
    }

    /// Retries answers of these statuses (a 500, say) that would be final.
    #[must_use]
    pub fn retry_statuses(mut self, statuses: Vec<u16>) -> Self {
        self.retry_statuses = statuses;
        self
    }

    /// The URL of `call` and the text its errors show: the base URL with
    /// the step's path (and query), or with its method as one more
    /// segment after checking it is one plain segment.
    fn url_of(&self, call: &TargetCall) -> Result<(Url, String), StepFailure> {
        let shape = call.shape.as_ref();
        let mut url = self.base.clone();
        let mut shown = self.shown.trim_end_matches('/').to_owned();
        match shape.and_then(|shape| shape.path.as_deref()) {
            // Checked when the definition compiled, its values encoded.
            Some(path) => {
                let joined = format!("{}{path}", url.path().trim_end_matches('/'));
                url.set_path(&joined);
                shown.push_str(path);
            }
            None => {
                if let Some(problem) = limits::method_problem(&call.method) {
                    return Err(StepFailure::Defect(format!("method {problem}")));
                }
                url.path_segments_mut()
                    .map_err(|()| {
                        StepFailure::Defect(format!("{} cannot hold a path", self.shown))
                    })?
                    .pop_if_empty()
                    .push(&call.method);
                shown.push('/');
                shown.push_str(&call.method);
            }
        }
        if let Some(query) = shape.and_then(flotilla_workflow::http::ResolvedCall::query_string) {
            let joined = match url.query() {
                Some(own) if !own.is_empty() => format!("{own}&{query}"),
                _ => query,
            };
            url.set_query(Some(&joined));
        }
        Ok((url, shown))
    }

    /// The step's own headers, its secrets filled in.
    fn headers_of(&self, call: &TargetCall) -> Result<HeaderMap, StepFailure> {
        let mut headers = HeaderMap::new();
        let Some(shape) = &call.shape else {
            return Ok(headers);
        };
        for (name, pieces) in &shape.headers {
            let mut value = Vec::new();
            let mut secret = false;
            for piece in pieces {
                match piece {
                    HeaderPiece::Text(text) => value.extend_from_slice(text.as_bytes()),
                    HeaderPiece::Secret(key) => {
                        // The targets file lacks it: the worker's
                        // configuration, which an operator fixes.
                        let known = self.secrets.get(key).ok_or_else(|| {
                            StepFailure::retryable(
                                RetryClass::Other,
                                format!(
                                    "header {name}: this target has no secret {key:?} (add it to its secrets in the targets file)"
                                ),
                            )
                        })?;
                        value.extend_from_slice(known.as_bytes());
                        secret = true;
                    }
                }
            }
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| StepFailure::Defect(format!("{name:?} is not a header name")))?;
            let mut value = HeaderValue::from_bytes(&value)
                .map_err(|_| StepFailure::Defect(format!("header {name}: not a header value")))?;
            value.set_sensitive(secret);
            headers.insert(name, value);
        }
        Ok(headers)
    }
}

fn method_of(verb: Verb) -> reqwest::Method {
    match verb {
        Verb::Get => reqwest::Method::GET,
        Verb::Post => reqwest::Method::POST,
        Verb::Put => reqwest::Method::PUT,
        Verb::Patch => reqwest::Method::PATCH,
        Verb::Delete => reqwest::Method::DELETE,
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
    fn timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn default_verb(&self) -> Verb {
        self.default_verb
    }

    async fn call(&self, call: TargetCall) -> Result<serde_json::Value, StepFailure> {
        let verb = call
            .shape
            .as_ref()
            .and_then(|shape| shape.verb)
            .unwrap_or(self.default_verb);
        let (target_url, shown) = self.url_of(&call)?;
        // What error texts name the call by: its verb and URL, no query.
        let url = format!("{} {shown}", verb.as_str());
        // A GET or DELETE by the target's default, for a step whose rules
        // built a request: sending it without its body would lose it.
        let built = call
            .request
            .as_object()
            .is_some_and(|body| !body.is_empty());
        if !verb.has_body() && built {
            return Err(StepFailure::Defect(format!(
                "{url}: a {} sends no body, but the step's rules built one (give the step its own verb)",
                verb.as_str()
            )));
        }
        let mut request = self
            .client
            .request(method_of(verb), target_url)
            // The engine enforces `call.timeout` (already cut to the
            // target's timeout) and names it; this backstop fires a second
            // later, so it never races the engine's clearer verdict.
            .timeout(call.timeout.min(self.timeout) + BACKSTOP_GRACE)
            .headers(self.headers_of(&call)?)
            .header("Idempotency-Key", call.idempotency_key());
        if verb.has_body() {
            request = request.json(&call.request);
        }
        if let Some(traceparent) = &call.traceparent {
            request = request.header("traceparent", traceparent);
        }
        if let Some(tracestate) = &call.tracestate {
            request = request.header("tracestate", tracestate);
        }
        let response = request.send().await.map_err(|e| {
            // The error would show the full URL, user info and query too.
            let e = e.without_url();
            if e.is_builder() {
                // The request itself cannot be built (a header value, the
                // URL): the same call would fail the same way.
                StepFailure::Defect(format!("{url}: building the request: {e}"))
            } else if flotilla_runtime::tls::is_certificate_refused(&e) {
                StepFailure::Defect(format!(
                    "{url}: the target's TLS certificate was refused (set its ca_file?): {}",
                    error_chain(&e)
                ))
            } else {
                let class = if e.is_timeout() {
                    RetryClass::Timeout
                } else {
                    RetryClass::Transport
                };
                StepFailure::retryable(class, format!("{url}: {}", error_chain(&e)))
            }
        })?;
        let status = response.status();
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|value: &reqwest::header::HeaderValue| value.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header(reqwest::header::CONTENT_TYPE);
        let retry_after = header(reqwest::header::RETRY_AFTER)
            .and_then(|value| retry_after(&value, std::time::SystemTime::now()));
        let body = read_capped(response, self.max_response_bytes, &url).await?;
        let answer = Answer {
            status,
            body: &body,
            content_type: content_type.as_deref(),
            keep: self.error_body_bytes,
            retry_after,
            retried: &[&self.retry_statuses, &call.retry_statuses],
        };
        classify(&url, &answer)
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
            "{url}: the response body is {size} bytes, over the limit of {limit}"
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
        StepFailure::retryable(
            class,
            format!("{url}: reading the body: {}", e.without_url()),
        )
    })? {
        if body.len() + chunk.len() > limit {
            return Err(too_large(format!("more than {}", body.len() + chunk.len())));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A target's answer, and how much of its body an error text may show.
struct Answer<'a> {
    status: StatusCode,
    body: &'a [u8],
    content_type: Option<&'a str>,
    /// Bytes of the body an error text keeps.
    keep: usize,
    /// Its `Retry-After`, read as a wait from now.
    retry_after: Option<Duration>,
    /// Statuses retried here although they would be final: the target's
    /// and the step's.
    retried: &'a [&'a [u16]],
}

/// A `Retry-After` value as a wait from `now`: delay-seconds, or an
/// HTTP-date (RFC 9110, section 10.2.3). A date already past, or a value
/// that is neither, asks for no wait.
fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    at.duration_since(now).ok().filter(|wait| !wait.is_zero())
}

impl Answer<'_> {
    /// The body as an error text shows it: its length and content type,
    /// and the first `keep` bytes when the operator keeps any.
    fn excerpt(&self) -> String {
        let kind = self.content_type.unwrap_or("no content type");
        let mut text = format!("a {}-byte body ({kind})", self.body.len());
        if self.keep > 0 && !self.body.is_empty() {
            let kept = &self.body[..self.body.len().min(self.keep)];
            text.push_str(": ");
            text.push_str(&String::from_utf8_lossy(kept));
        }
        text
    }
}

/// How the engine takes an answer of `status` with `body` to `call` (its
/// verb and URL: `POST orders/create`), as if a call had received it: recorded answers (`flotilla workflows test`)
/// are classified by the same rules as live ones. The body is shown whole
/// in error texts, as a recording is the tester's own.
///
/// # Errors
/// The failure that answer is.
pub fn classify_recorded(
    call: &str,
    status: u16,
    body: &[u8],
    retry_after_header: Option<&str>,
) -> Result<serde_json::Value, StepFailure> {
    let status = StatusCode::from_u16(status)
        .map_err(|e| StepFailure::Defect(format!("{call}: status {status}: {e}")))?;
    let answer = Answer {
        status,
        body,
        content_type: Some("application/json"),
        keep: body.len(),
        retry_after: retry_after_header
            .and_then(|value| retry_after(value, std::time::SystemTime::now())),
        retried: &[],
    };
    classify(call, &answer)
}

/// A 2xx answer's value: its JSON; null for no body; the text of a body
/// that is not JSON and does not claim to be. A body that claims to be
/// JSON and is not, or text that is not UTF-8, broke the target's
/// contract.
fn success(url: &str, answer: &Answer<'_>) -> Result<serde_json::Value, StepFailure> {
    let (status, body) = (answer.status, answer.body);
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Value::Null);
    }
    let claims_json = answer
        .content_type
        .is_some_and(|kind| kind.to_ascii_lowercase().contains("json"));
    match serde_json::from_slice(body) {
        Ok(value) => Ok(value),
        Err(e) if claims_json => Err(StepFailure::Defect(format!(
            "{url}: {status} with a body that is not JSON ({e}): {}",
            answer.excerpt()
        ))),
        Err(_) => String::from_utf8(body.to_vec())
            .map(serde_json::Value::String)
            .map_err(|_| {
                StepFailure::Defect(format!(
                    "{url}: {status} with a body that is neither JSON nor UTF-8 text: {}",
                    answer.excerpt()
                ))
            }),
    }
}

fn classify(url: &str, answer: &Answer<'_>) -> Result<serde_json::Value, StepFailure> {
    let (status, body) = (answer.status, answer.body);
    if status.is_success() {
        return success(url, answer);
    }
    let code = status.as_u16();
    let retry = |error: String| StepFailure::Retryable {
        error,
        class: RetryClass::Status,
        // Only 429 and 503 say when to come back (RFC 9110, 6585).
        after: answer.retry_after.filter(|_| matches!(code, 429 | 503)),
        status: Some(code),
    };
    if answer
        .retried
        .iter()
        .any(|statuses| statuses.contains(&code))
    {
        return Err(retry(format!(
            "{url}: {status} (retried as its retry_on asks): {}",
            answer.excerpt()
        )));
    }
    match code {
        408 | 429 | 502 | 503 | 504 => Err(retry(format!("{url}: {status}: {}", answer.excerpt()))),
        // The target (or a proxy) refused the worker's credentials: every
        // job of this target would meet the same until the secret is fixed.
        401 | 407 => Err(retry(format!(
            "{url}: {status} (check the target's credentials): {}",
            answer.excerpt()
        ))),
        422 => {
            let violations = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|doc| doc.get("violations").and_then(|v| v.as_array()).cloned());
            match violations {
                // The violations are the target's verdict, meant for the
                // job's readers: kept whole.
                Some(list) => {
                    let violations: Vec<String> = list
                        .iter()
                        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                        .collect();
                    Err(StepFailure::Verdict {
                        message: format!("{url}: 422: {}", violations.join("; ")),
                        violations,
                    })
                }
                None => Err(StepFailure::Defect(format!(
                    "{url}: 422 without a violations list: {}",
                    answer.excerpt()
                ))),
            }
        }
        _ => Err(StepFailure::Defect(format!(
            "{url}: {status}: {}",
            answer.excerpt()
        ))),
    }
}

#[cfg(test)]
mod tests;
