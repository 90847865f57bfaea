//! `flotilla-targets`: what a step calls. A target is anything implementing [`Target`];
//! `http` targets come from the targets file, in-process ones are registered
//! by library users (and tests, and benchmarks). Every call holds a permit of
//! the target's semaphore, so one worker never has more than `max_concurrent`
//! calls in flight to one target.

pub mod file;
pub mod http;
pub mod kafka;
pub mod rate;

pub use rate::RateLimit;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use uuid::Uuid;

/// Calls in flight to one target from one worker, unless configured.
pub const DEFAULT_MAX_CONCURRENT: usize = 8;

/// Why a step did not produce a usable response, by class.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepFailure {
    /// Transient: try again later (connection refused, timeout, 503...);
    /// `class` says which kind of transient, for the retry counter.
    /// `after`: how long the target asked to be left alone (`Retry-After`
    /// on a 429 or 503), which the next attempt waits at least (bounded).
    /// `status`: the HTTP status that asked for the retry, if one did
    /// (what a step's retry policy may name).
    #[error("{error}")]
    Retryable {
        error: String,
        class: RetryClass,
        after: Option<Duration>,
        status: Option<u16>,
    },
    /// The work was judged and refused; `violations` say why.
    #[error("{message}")]
    Verdict {
        message: String,
        violations: Vec<String>,
    },
    /// A bug or a broken contract; retrying will not help.
    #[error("{0}")]
    Defect(String),
}

impl StepFailure {
    /// A transient failure of `class`.
    pub fn retryable(class: RetryClass, error: impl Into<String>) -> Self {
        Self::Retryable {
            error: error.into(),
            class,
            after: None,
            status: None,
        }
    }

    /// The same failure with its text prefixed by `context` (`step x: `),
    /// its class and `Retry-After` kept.
    #[must_use]
    pub fn within(self, context: &str) -> Self {
        match self {
            Self::Retryable {
                error,
                class,
                after,
                status,
            } => Self::Retryable {
                error: format!("{context}{error}"),
                class,
                after,
                status,
            },
            Self::Defect(error) => Self::Defect(format!("{context}{error}")),
            verdict @ Self::Verdict { .. } => verdict,
        }
    }

    /// What went wrong, in words.
    #[must_use]
    pub fn message(&self) -> &str {
        match self {
            Self::Retryable { error, .. } | Self::Defect(error) => error,
            Self::Verdict { message, .. } => message,
        }
    }
}

/// The kind of a transient failure: the `class` label of
/// `flotilla_step_retries_total`, a small fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryClass {
    /// The target did not answer in time: the step's timeout or the
    /// segment's deadline passed during the call, or the HTTP client's own
    /// timer fired.
    Timeout,
    /// The target could not be reached or the connection broke: refused,
    /// reset, closed before the whole body arrived.
    Transport,
    /// The target answered with a status that asks for a retry (408, 429,
    /// 502, 503, 504), or refused the credentials it was configured with
    /// (401, 407): a configuration fault of the world, not of the job.
    Status,
    /// The segment's deadline had passed before the next step began.
    Deadline,
    /// Any other transient failure: an in-process target's own, a target
    /// shutting down.
    Other,
}

impl RetryClass {
    /// The label value.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Transport => "transport",
            Self::Status => "status",
            Self::Deadline => "deadline",
            Self::Other => "other",
        }
    }
}

/// One invocation of a step.
#[derive(Debug, Clone)]
pub struct TargetCall {
    pub job_id: Uuid,
    pub step_name: String,
    pub method: String,
    pub request: serde_json::Value,
    pub timeout: Duration,
    /// The caller's trace context (W3C), sent as headers.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// Which part of the step this call is: an item of a `for_each`
    /// (`item-3`) or a page of a paged step (`page-2`); `None` for a whole
    /// step.
    pub part: Option<String>,
    /// HTTP statuses the step's retry policy retries although they would
    /// be final (`retry.retry_on`); other kinds of target ignore them.
    pub retry_statuses: Vec<u16>,
    /// The step's verb, path, query and headers, filled in, when it names
    /// any: an HTTP target sends them (`method` is then unused); other
    /// kinds of target ignore them.
    pub shape: Option<flotilla_workflow::http::ResolvedCall>,
}

impl TargetCall {
    /// `<job_id>:<step_name>`, and `:<part>` for an item or a page: the
    /// same for every retry of this call and different from every other
    /// call, so the target can deduplicate side effects.
    #[must_use]
    pub fn idempotency_key(&self) -> String {
        match &self.part {
            Some(part) => format!("{}:{}:{part}", self.job_id, self.step_name),
            None => format!("{}:{}", self.job_id, self.step_name),
        }
    }
}

/// Something a step can call.
#[async_trait::async_trait]
pub trait Target: Send + Sync + 'static {
    /// The operator's bound on one call, if the target has one: a step's
    /// `timeout_ms` and a workflow's `deadline_ms` never raise it.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// The verb of a call whose step names none (an HTTP target's `verb`).
    fn default_verb(&self) -> flotilla_workflow::Verb {
        flotilla_workflow::Verb::Post
    }

    /// Performs the call and returns the JSON response.
    ///
    /// # Errors
    /// A classified [`StepFailure`].
    async fn call(&self, call: TargetCall) -> Result<serde_json::Value, StepFailure>;
}

#[derive(Clone)]
struct Registered {
    target: Arc<dyn Target>,
    permits: Arc<Semaphore>,
}

/// The targets a worker can call, by name, and the Kafka targets its
/// steps send requests to.
#[derive(Clone)]
pub struct Targets {
    by_name: HashMap<String, Registered>,
    kafka: HashMap<String, Arc<kafka::KafkaTarget>>,
    /// The encoding of Kafka targets that do not name one.
    fleet_encoding: kafka::Encoding,
    /// The rate limits of the targets that have one, fleet-wide.
    rate_limits: HashMap<String, RateLimit>,
}

impl Default for Targets {
    fn default() -> Self {
        Self {
            by_name: HashMap::new(),
            kafka: HashMap::new(),
            fleet_encoding: kafka::Encoding::Json,
            rate_limits: HashMap::new(),
        }
    }
}

impl std::fmt::Debug for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries(self.by_name.keys().chain(self.kafka.keys()))
            .finish()
    }
}

impl Targets {
    /// Registers `target` under `name` with at most `max_concurrent` calls at once.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        target: Arc<dyn Target>,
        max_concurrent: usize,
    ) {
        let registered = Registered {
            target,
            permits: Arc::new(Semaphore::new(max_concurrent.max(1))),
        };
        self.by_name.insert(name.into(), registered);
    }

    /// Limits the calls to `name` that begin, fleet-wide, in any window of
    /// the rate's period (the engine takes a permit before each call).
    pub fn set_rate_limit(&mut self, name: impl Into<String>, rate: RateLimit) {
        self.rate_limits.insert(name.into(), rate);
    }

    /// The rate limit of `name`, if it has one.
    #[must_use]
    pub fn rate_limit(&self, name: &str) -> Option<RateLimit> {
        self.rate_limits.get(name).copied()
    }

    /// Registers the Kafka target `name`.
    pub fn register_kafka(&mut self, name: impl Into<String>, target: kafka::KafkaTarget) {
        self.kafka.insert(name.into(), Arc::new(target));
    }

    /// Says which encoding Kafka targets that name none use: the fleet's
    /// (Avro when a registry is configured).
    pub fn set_fleet_encoding(&mut self, encoding: kafka::Encoding) {
        self.fleet_encoding = encoding;
    }

    /// The encoding of Kafka targets that name none.
    #[must_use]
    pub fn fleet_encoding(&self) -> kafka::Encoding {
        self.fleet_encoding
    }

    /// The Kafka target `name`, if it is one.
    #[must_use]
    pub fn kafka(&self, name: &str) -> Option<&Arc<kafka::KafkaTarget>> {
        self.kafka.get(name)
    }

    /// Every Kafka target's reply topic, each once.
    #[must_use]
    pub fn reply_topics(&self) -> Vec<String> {
        let topics: std::collections::BTreeSet<String> = self
            .kafka
            .values()
            .map(|target| target.reply_topic.clone())
            .collect();
        topics.into_iter().collect()
    }

    /// Every Kafka target's request topic, each once.
    #[must_use]
    pub fn request_topics(&self) -> Vec<String> {
        let topics: std::collections::BTreeSet<String> = self
            .kafka
            .values()
            .map(|target| target.request_topic.clone())
            .collect();
        topics.into_iter().collect()
    }

    /// The names that definitions may use.
    #[must_use]
    pub fn names(&self) -> HashSet<String> {
        self.by_name
            .keys()
            .chain(self.kafka.keys())
            .cloned()
            .collect()
    }

    /// The operator's bound on one call to `name`, if it has one.
    #[must_use]
    pub fn timeout(&self, name: &str) -> Option<Duration> {
        self.by_name.get(name)?.target.timeout()
    }

    /// The verb a call to `name` uses when its step names none.
    #[must_use]
    pub fn default_verb(&self, name: &str) -> flotilla_workflow::Verb {
        self.by_name
            .get(name)
            .map_or(flotilla_workflow::Verb::Post, |r| r.target.default_verb())
    }

    /// Calls `name` under its concurrency cap. The caller bounds the call in
    /// time (`call.timeout` tells the target how long it has).
    ///
    /// # Errors
    /// An unknown target is a defect; otherwise the target's failure.
    pub async fn call(
        &self,
        name: &str,
        call: TargetCall,
    ) -> Result<serde_json::Value, StepFailure> {
        if self.kafka.contains_key(name) {
            return Err(StepFailure::Defect(format!(
                "target {name} is a Kafka target: only a workflow's own steps send to it (a compensation step calls)"
            )));
        }
        let registered = self
            .by_name
            .get(name)
            .ok_or_else(|| StepFailure::Defect(format!("unknown target {name:?}")))?;
        let _permit = registered.permits.acquire().await.map_err(|_| {
            StepFailure::retryable(RetryClass::Other, format!("target {name} is shutting down"))
        })?;
        let in_flight = metrics::gauge!("flotilla_target_in_flight", "target" => name.to_owned());
        in_flight.increment(1.0);
        // Decremented however the call ends (also when its future is dropped).
        let _in_flight = scopeguard::guard((), move |()| in_flight.decrement(1.0));
        registered.target.call(call).await
    }
}

/// An in-process target made of an async function: the quickest way for a
/// library user (or a test, or a benchmark) to register one.
pub struct FnTarget<F>(pub F);

impl<F> std::fmt::Debug for FnTarget<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnTarget")
    }
}

#[async_trait::async_trait]
impl<F, Fut> Target for FnTarget<F>
where
    F: Fn(TargetCall) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<serde_json::Value, StepFailure>> + Send + 'static,
{
    async fn call(&self, call: TargetCall) -> Result<serde_json::Value, StepFailure> {
        (self.0)(call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every retry of a call keeps its key; two items, two pages or an
    /// item and its step never share one (a target deduplicating by key
    /// would answer the second with the first's answer).
    #[test]
    fn each_item_and_page_has_an_idempotency_key_of_its_own() {
        let call = |part: Option<&str>| TargetCall {
            job_id: Uuid::nil(),
            step_name: "score".into(),
            method: "m".into(),
            request: serde_json::Value::Null,
            timeout: Duration::from_secs(1),
            traceparent: None,
            tracestate: None,
            part: part.map(str::to_owned),
            retry_statuses: Vec::new(),
            shape: None,
        };
        let nil = Uuid::nil();
        assert_eq!(call(None).idempotency_key(), format!("{nil}:score"));
        assert_eq!(
            call(Some("item-3")).idempotency_key(),
            format!("{nil}:score:item-3")
        );
        assert_ne!(
            call(Some("item-3")).idempotency_key(),
            call(Some("item-4")).idempotency_key()
        );
        assert_eq!(
            call(Some("page-0")).idempotency_key(),
            format!("{nil}:score:page-0")
        );
    }
}
