//! Whether a retryable failure is tried again, and when: by the failed
//! step's retry policy and its own count of failed attempts (the row's
//! `failed_attempts`). A failure no step owns (the segment's deadline
//! passed before the next step began) is judged by the workflow's policy
//! and counted apart, under [`JOB_KEY`].

use std::time::Duration;

use flotilla_store::runs::RunRow;
use flotilla_targets::StepFailure;
use flotilla_workflow::{CompiledWorkflow, StepRetry};

use crate::Engine;

/// Where `failed_attempts` counts the failures no step owns: no step is
/// named blank.
pub(crate) const JOB_KEY: &str = "";

/// What becomes of a retryable failure.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Retrying {
    /// Another attempt after `delay`; the step's failed attempts so far,
    /// this one counted, of the attempts its policy allows.
    Again {
        delay: Duration,
        failed: i32,
        of: i32,
    },
    /// No more attempts: why, in words added to the job's error.
    Exhausted(String),
}

/// What becomes of `failure` of `step` (`None`: a failure no step owns);
/// `None` when the failure is not retryable at all.
pub(crate) fn retrying(
    engine: &Engine,
    row: &RunRow,
    compiled: Option<&CompiledWorkflow>,
    step: Option<&str>,
    failure: &StepFailure,
) -> Option<Retrying> {
    let StepFailure::Retryable {
        class,
        after,
        status,
        ..
    } = failure
    else {
        return None;
    };
    let settings = engine.settings();
    let fleet = (settings.backoff_base, settings.backoff_max);
    let owned = step.and_then(|name| {
        let compiled = compiled?;
        let step = compiled.step(compiled.step_index(name)?)?;
        Some((name, step.retry.clone()))
    });
    let (key, policy) = owned.unwrap_or_else(|| {
        let workflow = compiled.and_then(|c| c.definition.retry.as_ref());
        (
            JOB_KEY,
            StepRetry::resolve(None, workflow, row.max_attempts),
        )
    });
    let whose = if key == JOB_KEY {
        "the job".to_owned()
    } else {
        format!("step {key}")
    };
    if policy.never_retries(class.label(), *status) {
        let what = status.map_or_else(|| class.label().to_owned(), |s| s.to_string());
        return Some(Retrying::Exhausted(format!(
            "{whose}'s retry policy never retries {what}"
        )));
    }
    let failed = row.failed_attempts.0[key]
        .as_i64()
        .and_then(|n| i32::try_from(n).ok())
        .unwrap_or(0)
        .saturating_add(1);
    let spread = retry_spread(row.job_id, key, failed);
    let (delay, of) = (policy.pause(failed, fleet, spread), policy.attempts);
    if failed >= of {
        return Some(Retrying::Exhausted(format!(
            "{whose} failed {failed} of {of} attempts"
        )));
    }
    // A target that said when to come back is left alone that long, up to
    // the longest pause between attempts.
    let delay = after.map_or(delay, |after| delay.max(after.min(fleet.1)));
    Some(Retrying::Again { delay, failed, of })
}

/// Where in the jitter a pause falls, from 0 to 1: derived from the job,
/// the step and its failed attempts, so jobs that failed together spread
/// out, and the same failure always gets the same pause (a rehearsal
/// prints the same path twice).
pub(crate) fn retry_spread(job_id: uuid::Uuid, step: &str, failed: i32) -> f64 {
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::new()
        .chain_update(job_id.as_bytes())
        .chain_update(step.as_bytes())
        .chain_update(failed.to_be_bytes())
        .finalize();
    let mut word = [0u8; 8];
    word.copy_from_slice(&digest[..8]);
    // 53 bits: as many as an f64 holds exactly.
    (u64::from_be_bytes(word) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::retry_spread;

    #[test]
    fn spreads_are_stable_per_failure_and_cover_the_range() {
        let job = uuid::Uuid::from_u128(7);
        assert_eq!(retry_spread(job, "a", 1), retry_spread(job, "a", 1));
        assert_ne!(retry_spread(job, "a", 1), retry_spread(job, "a", 2));
        assert_ne!(retry_spread(job, "a", 1), retry_spread(job, "b", 1));
        let spreads: Vec<f64> = (0..1000u128)
            .map(|n| retry_spread(uuid::Uuid::from_u128(n), "a", 1))
            .collect();
        assert!(spreads.iter().all(|s| (0.0..1.0).contains(s)));
        // A herd of a thousand jobs lands in every tenth of the span.
        for tenth in 0..10 {
            let (low, high) = (f64::from(tenth) / 10.0, f64::from(tenth + 1) / 10.0);
            let count = spreads.iter().filter(|s| (low..high).contains(*s)).count();
            assert!(count > 50, "{count} in [{low}, {high})");
        }
    }
}
