//! [`Submitter`]: a `WorkflowRunRequest` to the fleet, through Kafka or the
//! HTTP API, returning once the request is durable. The HTTP route is
//! here; the Kafka route, behind the `kafka` feature, is `produce.rs`.

use std::time::Duration;

use flotilla_contracts::WorkflowRunRequest;
use reqwest::StatusCode;
use secrecy::{ExposeSecret as _, SecretString};
use serde::Serialize;
use uuid::Uuid;

pub use crate::submit_error::SubmitError;

/// How long one HTTP submission may take.
pub(crate) const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// One run request: the workflow, its input and the job id (the
/// idempotency key: the same id twice is one job).
#[derive(Debug, Clone)]
pub struct Submission {
    job_id: Uuid,
    workflow_name: String,
    input: serde_json::Value,
    workflow_version: Option<i32>,
    priority: Option<i32>,
    metadata: Option<flotilla_contracts::Metadata>,
    traceparent: Option<(String, Option<String>)>,
}

impl Submission {
    /// A request to run `workflow_name` on `input` (any serializable value,
    /// or a `serde_json::Value`), under a new job id.
    ///
    /// # Errors
    /// [`SubmitError::Rejected`] when `input` does not serialize to JSON.
    pub fn new(workflow_name: &str, input: &impl Serialize) -> Result<Self, SubmitError> {
        let input = serde_json::to_value(input)
            .map_err(|e| SubmitError::Rejected(format!("the input is not JSON: {e}")))?;
        Ok(Self {
            job_id: Uuid::new_v4(),
            workflow_name: workflow_name.to_owned(),
            input,
            workflow_version: None,
            priority: None,
            metadata: None,
            traceparent: None,
        })
    }

    /// Runs this stored version (from 1) instead of the newest.
    #[must_use]
    pub fn with_workflow_version(mut self, version: i32) -> Self {
        self.workflow_version = Some(version);
        self
    }

    /// Gives the job a head start in the queue: 0 (the default) to 10, a
    /// minute per point over jobs of lower priority.
    #[must_use]
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Labels the job (`customer` → `ada`): kept with it, echoed on its
    /// events, searchable in the API. At most 16 entries; keys of letters,
    /// digits, `_`, `-` and `.`; values up to 256 characters (checked when
    /// it is submitted).
    #[must_use]
    pub fn with_metadata<K: Into<String>, V: Into<String>>(
        mut self,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        let metadata = self.metadata.get_or_insert_with(Default::default);
        metadata.extend(entries.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Uses `job_id` instead of a new one: a retry after
    /// [`SubmitError::Unavailable`] must use the same id.
    #[must_use]
    pub fn with_job_id(mut self, job_id: Uuid) -> Self {
        self.job_id = job_id;
        self
    }

    /// Joins the run to this W3C trace context instead of the current
    /// span's.
    #[must_use]
    pub fn with_traceparent(mut self, traceparent: String, tracestate: Option<String>) -> Self {
        self.traceparent = Some((traceparent, tracestate));
        self
    }

    /// The job id.
    #[must_use]
    pub fn job_id(&self) -> Uuid {
        self.job_id
    }

    pub(crate) fn request(&self) -> Result<WorkflowRunRequest, SubmitError> {
        WorkflowRunRequest::new(self.job_id, &self.workflow_name, self.input.clone())
            .and_then(|request| request.with_workflow_version(self.workflow_version))
            .and_then(|request| request.with_priority(self.priority))
            .and_then(|request| request.with_metadata(self.metadata.clone()))
            .map_err(|e| SubmitError::Rejected(e.to_string()))
    }

    /// The trace context to send: the one given, or the current span's
    /// when the program records traces with OpenTelemetry.
    pub(crate) fn trace_context(&self) -> Option<(String, Option<String>)> {
        self.traceparent
            .clone()
            .or_else(|| flotilla_runtime::trace::context_headers(&tracing::Span::current()))
    }
}

/// Where a submission landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Receipt {
    /// Acknowledged by every in-sync replica of the request topic.
    Kafka {
        job_id: Uuid,
        partition: i32,
        offset: i64,
    },
    /// Committed by a worker's API: `created` is false for a repeat of a
    /// job id the fleet already had with the same content.
    Api { job_id: Uuid, created: bool },
}

impl Receipt {
    /// The job id.
    #[must_use]
    pub fn job_id(&self) -> Uuid {
        match self {
            Self::Kafka { job_id, .. } | Self::Api { job_id, .. } => *job_id,
        }
    }
}

/// Sends run requests to the fleet. Cheap to share: one per process.
pub struct Submitter {
    pub(crate) route: Route,
}

impl std::fmt::Debug for Submitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.route {
            #[cfg(feature = "kafka")]
            Route::Kafka(kafka) => f
                .debug_struct("Submitter")
                .field("request_topic", &kafka.request_topic)
                .finish_non_exhaustive(),
            Route::Api { base_url, .. } => f
                .debug_struct("Submitter")
                .field("api", base_url)
                .finish_non_exhaustive(),
        }
    }
}

pub(crate) enum Route {
    /// Boxed: the producer and the codec's registry clients are large
    /// beside the API route.
    #[cfg(feature = "kafka")]
    Kafka(Box<crate::produce::KafkaRoute>),
    Api {
        client: reqwest::Client,
        base_url: String,
        token: Option<SecretString>,
    },
}

impl Submitter {
    /// Submits through a worker's HTTP API (`POST /v1/jobs`) at `base_url`,
    /// with a bearer token when the fleet requires one.
    ///
    /// # Errors
    /// [`SubmitError::Settings`] when no HTTP client can be built.
    pub fn api(base_url: &str, token: Option<SecretString>) -> Result<Self, SubmitError> {
        let client = flotilla_runtime::tls::http_client()
            .timeout(HTTP_TIMEOUT)
            .build()
            .map_err(|e| SubmitError::Settings(format!("building the HTTP client: {e}")))?;
        Ok(Self {
            route: Route::Api {
                client,
                base_url: base_url.trim_end_matches('/').to_owned(),
                token,
            },
        })
    }

    /// Sends `submission` and waits until it is durable: acknowledged by
    /// the broker, or committed by the API.
    ///
    /// # Errors
    /// See [`SubmitError`]: only [`SubmitError::Unavailable`] is worth a
    /// retry, with the same job id.
    pub async fn submit(&self, submission: &Submission) -> Result<Receipt, SubmitError> {
        let request = submission.request()?;
        let trace = submission.trace_context();
        match &self.route {
            #[cfg(feature = "kafka")]
            Route::Kafka(kafka) => {
                let (partition, offset) = kafka.submit(&request, trace).await?;
                Ok(Receipt::Kafka {
                    job_id: request.job_id(),
                    partition,
                    offset,
                })
            }
            Route::Api {
                client,
                base_url,
                token,
            } => submit_to_api(client, base_url, token.as_ref(), &request, trace, None)
                .await
                .map(|(receipt, _)| receipt),
        }
    }
}

#[cfg(feature = "kafka")]
impl Submitter {
    /// Produces to Kafka with the settings the contract needs: an
    /// idempotent producer waiting for every in-sync replica, keyed by job
    /// id (so a job's messages keep their order), Avro through the Schema
    /// Registry when `broker` names one, JSON otherwise.
    ///
    /// # Errors
    /// [`SubmitError::Settings`] for settings that cannot work.
    pub fn kafka(broker: &flotilla_runtime::BrokerConfig) -> Result<Self, SubmitError> {
        let kafka = crate::produce::KafkaRoute::new(broker)?;
        Ok(Self {
            route: Route::Kafka(Box::new(kafka)),
        })
    }

    /// Produces requests to `topic` instead of `workflow-run-requests`
    /// (Kafka only).
    #[must_use]
    pub fn with_request_topic(mut self, topic: &str) -> Self {
        if let Route::Kafka(kafka) = &mut self.route {
            topic.clone_into(&mut kafka.request_topic);
        }
        self
    }

    /// Produces signals to `topic` instead of `workflow-run-signals`
    /// (Kafka only).
    #[must_use]
    pub fn with_signal_topic(mut self, topic: &str) -> Self {
        if let Route::Kafka(kafka) = &mut self.route {
            topic.clone_into(&mut kafka.signal_topic);
        }
        self
    }

    /// Reads the jobs' ends for [`Submitter::submit_and_wait`] from `topic`
    /// instead of `workflow-run-events` (Kafka only).
    #[must_use]
    pub fn with_event_topic(mut self, topic: &str) -> Self {
        if let Route::Kafka(kafka) = &mut self.route {
            kafka.ends.set_topic(topic);
        }
        self
    }

    /// Produces a signal for a waiting job (Kafka only; over HTTP use
    /// [`Jobs::signal`](crate::Jobs::signal)). Returns the record's
    /// partition and offset.
    ///
    /// # Errors
    /// As [`Submitter::submit`]; [`SubmitError::Settings`] on the API route.
    pub async fn signal(
        &self,
        signal: &flotilla_contracts::WorkflowRunSignal,
    ) -> Result<(i32, i64), SubmitError> {
        match &self.route {
            Route::Kafka(kafka) => kafka.signal(signal).await,
            Route::Api { .. } => Err(SubmitError::Settings(
                "signals are produced to Kafka; this submitter talks to the HTTP API".to_owned(),
            )),
        }
    }
}

/// Posts `request`; with `prefer_wait`, asks the API to answer once the job
/// finishes within it (`Prefer: wait`). The receipt and the job's view.
pub(crate) async fn submit_to_api(
    client: &reqwest::Client,
    base_url: &str,
    token: Option<&SecretString>,
    request: &WorkflowRunRequest,
    trace: Option<(String, Option<String>)>,
    prefer_wait: Option<Duration>,
) -> Result<(Receipt, serde_json::Value), SubmitError> {
    let url = format!("{base_url}/v1/jobs");
    let mut body = serde_json::json!({
        "job_id": request.job_id(),
        "workflow_name": request.workflow_name(),
        "input": request.input(),
    });
    if let Some(priority) = request.priority() {
        body["priority"] = serde_json::json!(priority);
    }
    if let Some(version) = request.workflow_version() {
        body["workflow_version"] = serde_json::json!(version);
    }
    if let Some(metadata) = request.metadata() {
        body["metadata"] = serde_json::json!(metadata);
    }
    let mut call = client.post(&url).json(&body);
    if let Some(wait) = prefer_wait {
        call = call
            .header("prefer", format!("wait={}", wait.as_secs()))
            .timeout(wait + HTTP_TIMEOUT);
    }
    if let Some(token) = token {
        call = call.bearer_auth(token.expose_secret());
    }
    if let Some((traceparent, tracestate)) = trace {
        call = call.header("traceparent", traceparent);
        if let Some(tracestate) = tracestate {
            call = call.header("tracestate", tracestate);
        }
    }
    let response = call.send().await.map_err(|e| {
        if e.is_builder() {
            SubmitError::Settings(format!("{url}: {e}"))
        } else {
            SubmitError::Unavailable(format!("{url}: {e}"))
        }
    })?;
    let status = response.status();
    if status.is_success() {
        let receipt = Receipt::Api {
            job_id: request.job_id(),
            created: status == StatusCode::CREATED,
        };
        let job = response
            .json()
            .await
            .map_err(|e| SubmitError::Unavailable(format!("{url}: reading the answer: {e}")))?;
        return Ok((receipt, job));
    }
    Err(refusal(&url, status, response).await)
}

/// The error of an API answer that is not a success.
pub(crate) async fn refusal(
    url: &str,
    status: StatusCode,
    response: reqwest::Response,
) -> SubmitError {
    let detail = response
        .json::<serde_json::Value>()
        .await
        .ok()
        .and_then(|body| body["detail"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let text = format!("{url}: {status} {detail}");
    match status.as_u16() {
        401 | 403 => SubmitError::Settings(text),
        408 | 429 => SubmitError::Unavailable(text),
        400..=499 => SubmitError::Rejected(text),
        _ => SubmitError::Unavailable(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_spans_trace_goes_with_the_request_unless_one_is_given() {
        use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        use tracing_subscriber::layer::SubscriberExt as _;

        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("client-test")));
        let submission = Submission::new("shipping", &serde_json::json!({})).unwrap();
        assert_eq!(submission.trace_context(), None, "no span, no trace");
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("checkout");
            let _entered = span.enter();
            let trace_id = span.context().span().span_context().trace_id();
            let (traceparent, _) = submission.trace_context().expect("the span's trace");
            assert_eq!(
                traceparent.split('-').nth(1),
                Some(trace_id.to_string().as_str())
            );
            let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
            let explicit = submission.clone().with_traceparent(given.to_owned(), None);
            assert_eq!(explicit.trace_context(), Some((given.to_owned(), None)));
        });
    }
}
