//! The workflow document as users write it (its rules: docs/architecture.md).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::retry::RetryPolicy;

fn default_deadline_ms() -> u64 {
    30_000
}

pub(crate) fn default_max_attempts() -> i32 {
    3
}

/// The most steps of one job running at once, unless its definition says.
pub const DEFAULT_PARALLELISM: u32 = 8;
/// The most a definition may ask for.
pub const MAX_PARALLELISM: u32 = 64;
/// The most items of one `for_each`, unless its step says.
pub const DEFAULT_MAX_ITEMS: u32 = 1_000;
/// The most a step may ask for.
pub const MAX_ITEMS: u32 = 10_000;
/// The most pages of one paged step, unless its step says.
pub const DEFAULT_MAX_PAGES: u32 = 10_000;
/// The most a step may ask for.
pub const MAX_PAGES: u32 = 1_000_000;
/// The longest segment a definition may ask for (`deadline_ms`): a day.
pub const MAX_DEADLINE_MS: u64 = 24 * 60 * 60 * 1000;
/// The most attempts a definition may ask for.
pub const MAX_ATTEMPTS: i32 = 100;

/// A workflow: steps over a validated input, each needing the one before
/// it unless it names its `needs` (a graph: `graph.rs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowDefinition {
    /// The workflow's name: what requests and schedules name, the key its
    /// versions are stored under.
    #[schemars(length(min = 1, max = 200))]
    pub name: String,
    /// JSON Schema of the input; `{}` accepts anything.
    pub input_schema: serde_json::Value,
    /// The steps, in definition order (the order ready steps start in).
    #[schemars(length(min = 1, max = 999))]
    pub steps: Vec<StepDefinition>,
    /// Assignments `field = <CEL>` building the job's `result` from `input`
    /// and `steps`. Without it the result is the last step's response.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output: Vec<String>,
    /// CEL string expression over `input`, `steps` and `result` giving the
    /// verdict of a completed job; without it, `completed N steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Budget of one segment (one claim), in milliseconds.
    #[serde(default = "default_deadline_ms")]
    #[schemars(range(min = 1, max = 86_400_000))]
    pub deadline_ms: u64,
    /// Attempts of each step before the job goes DEAD on its retryable
    /// failures: the default of every step's `retry.attempts`.
    #[serde(default = "default_max_attempts")]
    #[schemars(range(min = 1, max = 100))]
    pub max_attempts: i32,
    /// Every step's retry policy unless the step says otherwise, field by
    /// field (see [`RetryPolicy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// The longest the whole job may run, in milliseconds from when it was
    /// accepted: past it the job FAILS as timed out (compensation runs),
    /// whatever it is doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31_622_400_000_u64))]
    pub execution_timeout_ms: Option<u64>,
    /// Runs one job per burst of requests with the same key: each request
    /// waits `window_ms`, and a later one with its key, arriving before
    /// the earlier has started, cancels it (the last input wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<Debounce>,
    /// At most `limit` jobs of one key run at once, fleet-wide; what
    /// arrives past it waits its turn, or cancels the newest or the oldest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// The most steps of one job called at once (default
    /// [`DEFAULT_PARALLELISM`]); the targets' caps bound them too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub parallelism: Option<u32>,
    /// Compensation: plain steps run in order when the job is about to
    /// end FAILED or DEAD, with `failure` (`step`, `error`) in scope.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_failure: Vec<StepDefinition>,
}

impl WorkflowDefinition {
    #[must_use]
    pub fn parallelism(&self) -> usize {
        self.parallelism.unwrap_or(DEFAULT_PARALLELISM) as usize
    }
}

/// How a step completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Completion {
    /// Someone outside calls complete-step; the job parks until then.
    External,
}

/// A workflow's debounce: requests of one key within a window make one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Debounce {
    /// CEL over `input` giving the key (a string or a number): requests
    /// with equal keys are one burst.
    pub key: String,
    /// How long a job waits for a later request of its key before it
    /// starts, in milliseconds (1 to 86,400,000).
    #[schemars(range(min = 1, max = 86_400_000))]
    pub window_ms: u64,
}

/// A workflow's concurrency key: at most `limit` jobs of one key hold a
/// slot at once (a job takes one when it first runs and keeps it, through
/// its waits and retries, until it ends).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Concurrency {
    /// CEL over `input` giving the key (a string or a number).
    pub key: String,
    /// The most jobs of one key running or waiting at once (1 to 10,000).
    #[schemars(range(min = 1, max = 10_000))]
    pub limit: u32,
    /// What a job arriving past the limit does (default `queue`).
    #[serde(default)]
    pub on_excess: OnExcess,
}

/// What a job of a concurrency key arriving past its limit does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnExcess {
    /// It waits for a slot; slots go to the key's jobs in order of arrival.
    #[default]
    Queue,
    /// It is CANCELLED at once.
    CancelNewest,
    /// The oldest jobs of the key not ended are cancelled to make room
    /// (a running one as an operator's cancel would: at its next step).
    CancelOldest,
}

/// What a wait past its `timeout_ms` comes to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum OnTimeout {
    /// The job FAILS with a verdict naming the step (compensation runs).
    Fail,
    /// The step is checkpointed as skipped: dependants run, without it
    /// in `steps`.
    Skip,
    /// This value is the step's response (not judged by `output_schema`
    /// or `validate`: it is the author's, not an answer).
    Value(serde_json::Value),
}

/// The HTTP verb of a step's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verb {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Verb {
    /// The verb as HTTP writes it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
        }
    }

    /// Whether its request carries a body (`GET` and `DELETE` do not).
    #[must_use]
    pub fn has_body(self) -> bool {
        !matches!(self, Self::Get | Self::Delete)
    }
}

/// A step that polls: called again while its answer is not the one it
/// waits for, sleeping between calls without holding a lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Repeat {
    /// CEL boolean over `response` (and `input`, the steps it needs): true
    /// ends the step with this answer.
    pub until: String,
    /// The pause between calls (`30s`, `5m`): 1 second to a day.
    pub every: String,
    /// The longest the step polls, from its first call (`1h`): at most
    /// 366 days and 10,000 pauses.
    #[serde(rename = "for")]
    pub for_at_most: String,
}

/// What a `start` step starts: a stored workflow, its input built by
/// assignments as a call's request is by `rules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartChild {
    /// The stored workflow the child runs (its newest version).
    pub workflow: String,
    /// Assignments `field.path = <CEL>` over `input` and the steps it needs.
    #[serde(default)]
    pub input: Vec<String>,
}

/// One step: a call to `target`'s `method` with a request built by `rules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StepDefinition {
    /// The step's name, unique in the workflow: what `needs`, `steps.<name>`,
    /// checkpoints and events call it.
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    /// The steps that end before this one starts, and the only ones its
    /// expressions read; unset: the step before it (none for the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<Vec<String>>,
    /// CEL boolean over `input` and the steps it needs: false skips the
    /// step (checkpointed as skipped, its target never called).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// A timer: waits this long (`30m`, `2s`) after its last need ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep: Option<String>,
    /// A timer: waits until this instant, a CEL expression over `input`
    /// and the steps it needs giving an RFC 3339 timestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// CEL list over `input` and the steps it needs: the target is called
    /// once per item (`item`, `index` in its rules and `validate`), and
    /// the step's response is the list of answers in item order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<String>,
    /// The most items a `for_each` may give (default
    /// [`DEFAULT_MAX_ITEMS`]); more is the job's verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000))]
    pub max_items: Option<u32>,
    /// Called again while its answer says `more: true`, given the `cursor`
    /// that answer held (`cursor` is null on the first call); its
    /// response is the last page's answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paged: bool,
    /// The most pages a paged step may fetch (default
    /// [`DEFAULT_MAX_PAGES`]); a page saying `more: true` past them is
    /// the job's verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_pages: Option<u32>,
    /// The target called; empty for a timer.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
    /// What the target is asked: for an HTTP target, one path segment
    /// appended to its `base_url` (letters, digits, `-`, `_`, `.`, `~`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub method: String,
    /// For an HTTP target: the verb (unset: the target's `verb`, else
    /// `POST`). `GET` and `DELETE` send no body, so such a step has no
    /// `rules`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verb: Option<Verb>,
    /// For an HTTP target, instead of `method`: a path under its
    /// `base_url`, starting with `/`, whose `{<CEL>}` placeholders (over
    /// `input`, the steps it needs, `item`) are each percent-encoded into
    /// the segment they sit in: `/orders/{input.order_id}/lines`. `{{` and
    /// `}}` are literal braces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub path: Option<String>,
    /// For an HTTP target: query parameters, each value a template as in
    /// `path` (a value that is one placeholder giving null leaves its
    /// parameter out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query: BTreeMap<String, String>,
    /// For an HTTP target: headers, each value a template as in `path`;
    /// `{secrets.<name>}` is the target's secret of that name (from the
    /// targets file: never in a definition, a row, an event or a log).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Assignments `field.path = <CEL>` over `input` and `steps.<a step it needs>`.
    #[serde(default)]
    pub rules: Vec<String>,
    /// JSON Schema the response must fit (else the target broke its
    /// contract: the job fails as a defect). An HTTP answer that is not
    /// JSON is a string here, and an empty one null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
    /// CEL booleans over `response` (and `input`, `steps`); a false one is a verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validate: Vec<String>,
    /// `external`: the job parks on this step until someone answers it
    /// (complete-step); it calls no target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<Completion>,
    /// Waits for the signal of this name sent to the job (API, CLI,
    /// console or the signal topic); its response is the signal's payload,
    /// judged by `output_schema` and `validate`. Calls no target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for: Option<String>,
    /// Starts a child job of a stored workflow and waits for it (no lease
    /// held); its response is the child's result. Calls no target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartChild>,
    /// For a `start` step: whether cancelling this job cancels the child
    /// (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_children: Option<bool>,
    /// For a call: the longest one call may take, in milliseconds (the
    /// target's own timeout caps it). For a `wait_for`, `start` or
    /// external step: the longest it waits, counted from when the job
    /// first reached it; then `on_timeout` ends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// What a wait past its `timeout_ms` comes to: `fail` (the default:
    /// the job FAILS with a verdict naming the step), `skip` (checkpointed
    /// as skipped, as a false `when` is) or `{value: …}` (that value is the
    /// step's response).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
    /// Calls the target again, `every` apart, while `until` is false,
    /// for at most `for`; then `on_timeout` ends it (`fail` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<Repeat>,
    /// How this step's transient failures are retried; its gaps are the
    /// workflow's `retry`, then the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
}

impl StepDefinition {
    /// Whether this step is a timer (`sleep` or `until`), calling nothing.
    #[must_use]
    pub fn is_timer(&self) -> bool {
        self.sleep.is_some() || self.until.is_some()
    }

    /// The most items its `for_each` may give.
    #[must_use]
    pub fn max_items(&self) -> usize {
        self.max_items.unwrap_or(DEFAULT_MAX_ITEMS) as usize
    }

    /// The most pages it may fetch, when paged.
    #[must_use]
    pub fn max_pages(&self) -> u32 {
        self.max_pages.unwrap_or(DEFAULT_MAX_PAGES)
    }

    /// Whether it shapes its HTTP call beyond `method` (a verb, a path,
    /// query parameters or headers).
    #[must_use]
    pub fn shapes_its_call(&self) -> bool {
        self.verb.is_some()
            || self.path.is_some()
            || !self.query.is_empty()
            || !self.headers.is_empty()
    }

    #[must_use]
    pub fn is_external(&self) -> bool {
        self.completion == Some(Completion::External)
    }
}
