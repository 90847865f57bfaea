//! Retry policies: how often a step's transient failures are tried again,
//! how long each pause is, and which failures retry or never do. A policy
//! on the workflow is every step's default; a step's own fields win one by
//! one. Each step counts its failed attempts apart (the engine keeps the
//! counts on the job's row).

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kinds of transient failure a policy may name in `never_on`: the
/// `class` labels of a retryable failure (see the targets crate's
/// `RetryClass`).
pub const FAILURE_CLASSES: [&str; 5] = ["timeout", "transport", "status", "deadline", "other"];

/// The lowest and highest HTTP status a policy may name.
pub const POLICY_STATUSES: std::ops::RangeInclusive<u16> = 400..=599;

/// The largest `coefficient`.
pub const MAX_COEFFICIENT: f64 = 10.0;

/// A retry policy as written: every field optional, the gaps filled from
/// the workflow's policy, then from the defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts of the step before the job goes DEAD (1 to 100); default:
    /// the workflow's `max_attempts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub attempts: Option<i32>,
    /// The pause after the first failed attempt (`1s`, `500ms`); default:
    /// the fleet's `--backoff` (5 s unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_interval: Option<String>,
    /// Each pause is the one before times this (1 to 10; default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0, max = 10.0))]
    pub coefficient: Option<f64>,
    /// The longest pause (`2m`); default, and its upper bound: the fleet's
    /// `--backoff-max` (5 min unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<String>,
    /// Whether pauses are spread over their upper half, so jobs that
    /// failed together come back apart (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<bool>,
    /// HTTP statuses (400 to 599) retried although the target calls them
    /// final, such as 500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<Vec<u16>>,
    /// Failure classes (`timeout`, `transport`, `status`, `deadline`,
    /// `other`) or HTTP statuses never retried: the first such failure
    /// ends the job DEAD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub never_on: Option<Vec<FailureMatch>>,
}

/// A failure a policy names: an HTTP status or a failure class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum FailureMatch {
    Status(u16),
    Class(String),
}

/// A step's policy with every gap filled: what the engine retries by.
/// The pauses left `None` are the fleet's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRetry {
    pub attempts: i32,
    pub initial_interval: Option<Duration>,
    pub coefficient: f64,
    pub max_interval: Option<Duration>,
    pub jitter: bool,
    pub retry_statuses: Vec<u16>,
    pub never: Vec<FailureMatch>,
}

impl StepRetry {
    /// The policy of a workflow that says nothing: `attempts` per step,
    /// the fleet's pauses doubling, jittered.
    #[must_use]
    pub fn plain(attempts: i32) -> Self {
        Self {
            attempts,
            initial_interval: None,
            coefficient: 2.0,
            max_interval: None,
            jitter: true,
            retry_statuses: Vec::new(),
            never: Vec::new(),
        }
    }

    /// `step`'s fields over `workflow`'s over the plain policy of
    /// `max_attempts`; intervals already parsed (`parse_interval`).
    #[must_use]
    pub fn resolve(
        step: Option<&RetryPolicy>,
        workflow: Option<&RetryPolicy>,
        max_attempts: i32,
    ) -> Self {
        fn pick<'a, T>(
            (step, workflow): (Option<&'a RetryPolicy>, Option<&'a RetryPolicy>),
            field: fn(&'a RetryPolicy) -> Option<&'a T>,
        ) -> Option<&'a T> {
            step.and_then(field).or_else(|| workflow.and_then(field))
        }
        let both = (step, workflow);
        let plain = Self::plain(max_attempts);
        let interval = |text: Option<&String>| text.and_then(|t| parse_interval(t).ok());
        Self {
            attempts: pick(both, |p| p.attempts.as_ref())
                .copied()
                .unwrap_or(plain.attempts),
            initial_interval: interval(pick(both, |p| p.initial_interval.as_ref())),
            coefficient: pick(both, |p| p.coefficient.as_ref())
                .copied()
                .unwrap_or(plain.coefficient),
            max_interval: interval(pick(both, |p| p.max_interval.as_ref())),
            jitter: pick(both, |p| p.jitter.as_ref())
                .copied()
                .unwrap_or(plain.jitter),
            retry_statuses: pick(both, |p| p.retry_on.as_ref())
                .cloned()
                .unwrap_or_default(),
            never: pick(both, |p| p.never_on.as_ref())
                .cloned()
                .unwrap_or_default(),
        }
    }

    /// The pause after the step's `failed`th failed attempt: the initial
    /// interval (else `base`) times `coefficient^(failed−1)`, at most the
    /// max interval and never past `cap`; with jitter, spread over its
    /// upper half by `spread` (0 to 1).
    #[must_use]
    pub fn pause(&self, failed: i32, (base, cap): (Duration, Duration), spread: f64) -> Duration {
        let initial = self.initial_interval.unwrap_or(base);
        let longest = self.max_interval.map_or(cap, |max| max.min(cap));
        let exponent = failed.saturating_sub(1).clamp(0, 1_000);
        let seconds = initial.as_secs_f64() * self.coefficient.powi(exponent);
        let full = if seconds.is_finite() && seconds < longest.as_secs_f64() {
            Duration::from_secs_f64(seconds)
        } else {
            longest
        };
        if !self.jitter {
            return full;
        }
        let spread = if spread.is_finite() {
            spread.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let half = full / 2;
        half + (full - half).mul_f64(spread)
    }

    /// Whether a transient failure of `class` (and `status`, for an HTTP
    /// answer) is one this policy never retries.
    #[must_use]
    pub fn never_retries(&self, class: &str, status: Option<u16>) -> bool {
        self.never.iter().any(|never| match never {
            FailureMatch::Class(named) => named == class,
            FailureMatch::Status(named) => Some(*named) == status,
        })
    }
}

/// A policy's interval: a duration above zero and at most a day.
///
/// # Errors
/// Why the text is not one.
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be above 0".into()),
        Ok(duration) if duration > Duration::from_secs(24 * 3600) => {
            Err("over the limit of a day".into())
        }
        Ok(duration) => Ok(duration),
        Err(e) => Err(format!("not a duration such as 30s or 2m: {e}")),
    }
}

/// What is wrong with a policy as written, as (field, message) pairs;
/// `max_attempts` bounds its `attempts`.
#[must_use]
pub fn policy_problems(policy: &RetryPolicy, max_attempts: i32) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    if let Some(attempts) = policy.attempts
        && !(1..=max_attempts).contains(&attempts)
    {
        let max = max_attempts;
        problems.push((
            "retry.attempts",
            format!("must be 1 to {max}, got {attempts}"),
        ));
    }
    for (field, text) in [
        ("retry.initial_interval", &policy.initial_interval),
        ("retry.max_interval", &policy.max_interval),
    ] {
        if let Some(Err(e)) = text.as_deref().map(parse_interval) {
            problems.push((field, e));
        }
    }
    if let Some(coefficient) = policy.coefficient
        && !(1.0..=MAX_COEFFICIENT).contains(&coefficient)
    {
        problems.push((
            "retry.coefficient",
            format!("must be 1 to {MAX_COEFFICIENT}, got {coefficient}"),
        ));
    }
    let statuses = policy.retry_on.iter().flatten().copied();
    let named = policy.never_on.iter().flatten().filter_map(|m| match m {
        FailureMatch::Status(status) => Some(*status),
        FailureMatch::Class(_) => None,
    });
    for (field, status) in statuses
        .map(|s| ("retry.retry_on", s))
        .chain(named.map(|s| ("retry.never_on", s)))
    {
        if !POLICY_STATUSES.contains(&status) {
            problems.push((
                field,
                format!("{status} is not an HTTP status of 400 to 599"),
            ));
        }
    }
    for never in policy.never_on.iter().flatten() {
        if let FailureMatch::Class(class) = never
            && !FAILURE_CLASSES.contains(&class.as_str())
        {
            problems.push((
                "retry.never_on",
                format!(
                    "{class:?} is not a failure class ({}) or an HTTP status",
                    FAILURE_CLASSES.join(", ")
                ),
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: serde_json::Value) -> RetryPolicy {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_steps_fields_win_one_by_one_over_the_workflows_over_the_plain_policy() {
        let workflow = policy(
            serde_json::json!({"attempts": 5, "initial_interval": "2s", "never_on": ["timeout"]}),
        );
        let step = policy(serde_json::json!({"attempts": 2, "retry_on": [500]}));
        let resolved = StepRetry::resolve(Some(&step), Some(&workflow), 3);
        assert_eq!(resolved.attempts, 2);
        assert_eq!(resolved.initial_interval, Some(Duration::from_secs(2)));
        assert_eq!(resolved.retry_statuses, vec![500]);
        assert_eq!(resolved.never, vec![FailureMatch::Class("timeout".into())]);
        assert!(resolved.jitter);
        assert_eq!(StepRetry::resolve(None, None, 3), StepRetry::plain(3));
    }

    #[test]
    fn pauses_grow_by_the_coefficient_up_to_the_max_interval_and_the_fleets_cap() {
        let mut retry = StepRetry::plain(5);
        retry.jitter = false;
        retry.coefficient = 3.0;
        retry.initial_interval = Some(Duration::from_secs(1));
        let fleet = (Duration::from_secs(5), Duration::from_secs(60));
        let pauses: Vec<u64> = (1..=6)
            .map(|n| retry.pause(n, fleet, 0.5).as_secs())
            .collect();
        assert_eq!(pauses, vec![1, 3, 9, 27, 60, 60]);
        retry.max_interval = Some(Duration::from_secs(10));
        assert_eq!(retry.pause(4, fleet, 0.5), Duration::from_secs(10));
        retry.max_interval = Some(Duration::from_secs(600));
        assert_eq!(
            retry.pause(9, fleet, 0.5),
            Duration::from_secs(60),
            "the fleet's cap bounds a step's max"
        );
        retry.jitter = true;
        assert_eq!(retry.pause(2, fleet, 0.0), Duration::from_millis(1_500));
        assert_eq!(retry.pause(2, fleet, 1.0), Duration::from_secs(3));
        assert_eq!(retry.pause(i32::MAX, fleet, 1.0), Duration::from_secs(60));
    }

    #[test]
    fn never_on_names_classes_and_statuses() {
        let mut retry = StepRetry::plain(3);
        retry.never = vec![
            FailureMatch::Class("timeout".into()),
            FailureMatch::Status(429),
        ];
        assert!(retry.never_retries("timeout", None));
        assert!(retry.never_retries("status", Some(429)));
        assert!(!retry.never_retries("status", Some(503)));
        assert!(!retry.never_retries("transport", None));
    }

    #[test]
    fn a_policy_out_of_bounds_is_refused_field_by_field() {
        let wrong = policy(serde_json::json!({
            "attempts": 0, "initial_interval": "soon", "max_interval": "0s",
            "coefficient": 0.5, "retry_on": [200], "never_on": ["flaky", 99]
        }));
        let fields: Vec<&str> = policy_problems(&wrong, 100)
            .iter()
            .map(|(f, _)| *f)
            .collect();
        assert_eq!(
            fields,
            vec![
                "retry.attempts",
                "retry.initial_interval",
                "retry.max_interval",
                "retry.coefficient",
                "retry.retry_on",
                "retry.never_on",
                "retry.never_on"
            ]
        );
        assert!(policy_problems(&RetryPolicy::default(), 100).is_empty());
    }
}
