//! [`Jobs`]: the fleet's HTTP API for jobs already submitted: get one,
//! list them, wait for one, cancel, retry, signal, complete a step, read
//! its events, and act on many by filter.
//!
//! Every route it calls is in [`ROUTES`]; a test holds that list to the
//! API's own OpenAPI document, so the client and the API cannot drift
//! apart unnoticed.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret as _, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::submit::HTTP_TIMEOUT;

/// Every route [`Jobs`] calls: method and path as the OpenAPI document
/// names them.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{job_id}"),
    ("GET", "/v1/jobs/{job_id}/events"),
    ("POST", "/v1/jobs/{job_id}/cancel"),
    ("POST", "/v1/jobs/{job_id}/retry"),
    ("POST", "/v1/jobs/{job_id}/signals"),
    ("POST", "/v1/jobs/{job_id}/steps/{step_name}/complete"),
    ("POST", "/v1/jobs/bulk/retry"),
    ("POST", "/v1/jobs/bulk/cancel"),
    ("GET", "/v1/schedules"),
];

/// Why a call of [`Jobs`] did not do what it asked, classed once.
#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    /// No such job (404).
    #[error("not found: {0}")]
    NotFound(String),
    /// The job is not in a state the verb applies to (409).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The call can never succeed as it is (another 4xx): fix it.
    #[error("refused: {0}")]
    Rejected(String),
    /// The API could not answer now: the same call may be made again.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// This client's settings (the token refused, a URL that is no URL).
    #[error("client settings: {0}")]
    Settings(String),
}

/// A job as the API shows it: the fields most callers read, typed, and
/// the rest of the view as it came (`rest`).
#[derive(Debug, Clone, Deserialize)]
pub struct Job {
    pub job_id: Uuid,
    pub workflow_name: String,
    pub workflow_version: Option<i32>,
    /// QUEUED, RUNNING, WAITING, COMPLETED, FAILED, DEAD or CANCELLED.
    pub status: String,
    pub attempt: i32,
    pub result: Option<Value>,
    pub verdict: Option<String>,
    pub error: Option<String>,
    pub outstanding_step: Option<String>,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

impl Job {
    /// Whether the job has finished (until an operator retries it).
    #[must_use]
    pub fn is_finished(&self) -> bool {
        matches!(
            self.status.as_str(),
            "COMPLETED" | "FAILED" | "DEAD" | "CANCELLED"
        )
    }
}

/// One page of [`Jobs::list`], newest first.
#[derive(Debug, Clone, Deserialize)]
pub struct JobPage {
    pub jobs: Vec<Job>,
    /// Give it to the next call's `cursor`; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// Which jobs [`Jobs::list`] and the bulk verbs take: every field given
/// must hold.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub status: Option<String>,
    pub workflow_name: Option<String>,
    /// RFC 3339, inclusive.
    pub created_after: Option<String>,
    /// RFC 3339, exclusive.
    pub created_before: Option<String>,
    /// Labels the job's metadata must hold, every one (none: any job).
    pub metadata: std::collections::BTreeMap<String, String>,
}

impl JobFilter {
    /// The metadata filter as the API takes it: a JSON object.
    fn metadata(&self) -> Option<Value> {
        (!self.metadata.is_empty()).then(|| json!(self.metadata))
    }

    fn pairs(&self) -> Vec<(&'static str, &str)> {
        [
            ("status", &self.status),
            ("workflow_name", &self.workflow_name),
            ("created_after", &self.created_after),
            ("created_before", &self.created_before),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.as_deref().map(|v| (name, v)))
        .collect()
    }
}

/// The jobs of a fleet, through a worker's HTTP API. Cheap to clone.
#[derive(Clone)]
pub struct Jobs {
    client: reqwest::Client,
    base_url: String,
    token: Option<SecretString>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl Jobs {
    /// The API at `base_url`, with a bearer token when the fleet requires one.
    ///
    /// # Errors
    /// [`JobsError::Settings`] when no HTTP client can be built.
    pub fn new(base_url: &str, token: Option<SecretString>) -> Result<Self, JobsError> {
        let client = flotilla_runtime::tls::http_client()
            .build()
            .map_err(|e| JobsError::Settings(format!("building the HTTP client: {e}")))?;
        Ok(Self {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
            token,
        })
    }

    /// The job.
    ///
    /// # Errors
    /// [`JobsError::NotFound`], or as any call.
    pub async fn get(&self, job_id: Uuid) -> Result<Job, JobsError> {
        self.call(Method::GET, &format!("/v1/jobs/{job_id}"), &[], None, None)
            .await
    }

    /// The job once it has finished, or as it is when `wait` runs out (the
    /// API answers the moment it finishes; one call waits at most 25 s).
    ///
    /// # Errors
    /// As [`Jobs::get`].
    pub async fn wait(&self, job_id: Uuid, wait: Duration) -> Result<Job, JobsError> {
        let wait = wait.min(Duration::from_secs(25));
        let millis = format!("{}ms", wait.as_millis());
        let path = format!("/v1/jobs/{job_id}");
        self.call(Method::GET, &path, &[("wait", &millis)], None, Some(wait))
            .await
    }

    /// A page of the jobs `filter` matches, newest first (`limit` 0: the
    /// API's default page).
    ///
    /// # Errors
    /// [`JobsError::Rejected`] for a bad filter or cursor, or as any call.
    pub async fn list(
        &self,
        filter: &JobFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<JobPage, JobsError> {
        let limit = limit.to_string();
        let metadata = filter.metadata().map(|m| m.to_string());
        let mut query = filter.pairs();
        if let Some(metadata) = &metadata {
            query.push(("metadata", metadata));
        }
        if limit != "0" {
            query.push(("limit", &limit));
        }
        if let Some(cursor) = cursor {
            query.push(("cursor", cursor));
        }
        self.call(Method::GET, "/v1/jobs", &query, None, None).await
    }

    /// Cancels the job (a RUNNING one is ended by its worker shortly).
    ///
    /// # Errors
    /// [`JobsError::Conflict`] once it has finished, or as any call.
    pub async fn cancel(&self, job_id: Uuid, reason: Option<&str>) -> Result<Job, JobsError> {
        let body = reason.map(|reason| json!({ "reason": reason }));
        let path = format!("/v1/jobs/{job_id}/cancel");
        self.call(Method::POST, &path, &[], body.as_ref(), None)
            .await
    }

    /// Runs a DEAD, FAILED or CANCELLED job again.
    ///
    /// # Errors
    /// [`JobsError::Conflict`] for a job in another state, or as any call.
    pub async fn retry(&self, job_id: Uuid) -> Result<Job, JobsError> {
        let path = format!("/v1/jobs/{job_id}/retry");
        self.call(Method::POST, &path, &[], None, None).await
    }

    /// Sends the signal `name` with `payload`; `key` makes a repeat the
    /// same signal. The API's receipt.
    ///
    /// # Errors
    /// As any call; the refusals carry the API's `code`.
    pub async fn signal(
        &self,
        job_id: Uuid,
        name: &str,
        payload: &Value,
        key: Option<&str>,
    ) -> Result<Value, JobsError> {
        let mut body = json!({ "name": name, "payload": payload });
        if let Some(key) = key {
            body["idempotency_key"] = json!(key);
        }
        let path = format!("/v1/jobs/{job_id}/signals");
        self.call(Method::POST, &path, &[], Some(&body), None).await
    }

    /// Completes the external step `step` with `response`.
    ///
    /// # Errors
    /// [`JobsError::Conflict`] when the job does not wait on it, or as any call.
    pub async fn complete_step(
        &self,
        job_id: Uuid,
        step: &str,
        response: &Value,
    ) -> Result<Value, JobsError> {
        let body = json!({ "response": response });
        let path = format!("/v1/jobs/{job_id}/steps/{step}/complete");
        self.call(Method::POST, &path, &[], Some(&body), None).await
    }

    /// The job's events still in the outbox, by sequence.
    ///
    /// # Errors
    /// As [`Jobs::get`].
    pub async fn events(&self, job_id: Uuid) -> Result<Vec<Value>, JobsError> {
        #[derive(Deserialize)]
        struct Timeline {
            events: Vec<Value>,
        }
        let path = format!("/v1/jobs/{job_id}/events");
        let timeline: Timeline = self.call(Method::GET, &path, &[], None, None).await?;
        Ok(timeline.events)
    }

    /// Retries (`cancel` false) or cancels every job `filter` matches, or
    /// only counts them with `dry_run`: the API's outcome (`matched`,
    /// `changed`, `passed_over`, `more`).
    ///
    /// # Errors
    /// [`JobsError::Rejected`] for an empty or bad filter, or as any call.
    pub async fn bulk(
        &self,
        filter: &JobFilter,
        cancel: bool,
        dry_run: bool,
    ) -> Result<Value, JobsError> {
        let mut fields: serde_json::Map<String, Value> = filter
            .pairs()
            .into_iter()
            .map(|(name, value)| (name.to_owned(), json!(value)))
            .collect();
        if let Some(metadata) = filter.metadata() {
            fields.insert("metadata".to_owned(), metadata);
        }
        let body = json!({ "filter": fields, "dry_run": dry_run });
        let verb = if cancel { "cancel" } else { "retry" };
        let path = format!("/v1/jobs/bulk/{verb}");
        self.call(Method::POST, &path, &[], Some(&body), None).await
    }

    /// The fleet's schedules, as the API lists them.
    ///
    /// # Errors
    /// As any call.
    pub async fn schedules(&self) -> Result<Value, JobsError> {
        self.call(Method::GET, "/v1/schedules", &[], None, None)
            .await
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
        long_poll: Option<Duration>,
    ) -> Result<T, JobsError> {
        let mut url = reqwest::Url::parse(&format!("{}{path}", self.base_url))
            .map_err(|e| JobsError::Settings(format!("{}{path}: {e}", self.base_url)))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut request = self
            .client
            .request(method, url.clone())
            .timeout(HTTP_TIMEOUT + long_poll.unwrap_or_default());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token.expose_secret());
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| JobsError::Unavailable(format!("{url}: {e}")))?;
        let status = response.status();
        if status.is_success() {
            return response
                .json()
                .await
                .map_err(|e| JobsError::Unavailable(format!("{url}: reading the answer: {e}")));
        }
        let detail = response
            .json::<Value>()
            .await
            .ok()
            .and_then(|problem| problem["detail"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let text = format!("{url}: {status} {detail}");
        Err(match status {
            StatusCode::NOT_FOUND => JobsError::NotFound(text),
            StatusCode::CONFLICT => JobsError::Conflict(text),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => JobsError::Settings(text),
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => {
                JobsError::Unavailable(text)
            }
            s if s.is_client_error() => JobsError::Rejected(text),
            _ => JobsError::Unavailable(text),
        })
    }
}
