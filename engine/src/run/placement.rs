//! Heterogeneous fleets: during a rolling deploy some workers have a target
//! that others lack. A worker that lacks a target a job needs hands the job
//! back (no attempt spent, a visible reason, a growing pause) for one that
//! has it; the job fails only when no such worker has taken it within
//! `missing_target_wait`.

use std::time::Duration;

use serde_json::Value as Json;

use crate::Engine;
use crate::Outcome;
use crate::{ClaimedRun, SegmentStop};

/// The shortest and longest pause before a handed-back job is claimable again.
const RELEASE_PAUSE_MIN: Duration = Duration::from_secs(1);
const RELEASE_PAUSE_MAX: Duration = Duration::from_secs(60);

impl Engine {
    /// The targets the definition snapshot names that this worker lacks.
    pub(crate) fn missing_targets(&self, definition: &Json) -> Vec<String> {
        let known = self.targets().names();
        let mut missing: Vec<String> = ["steps", "on_failure"]
            .iter()
            .filter_map(|list| definition[*list].as_array())
            .flatten()
            .filter_map(|step| step["target"].as_str())
            // A timer calls no target.
            .filter(|target| !target.is_empty() && !known.contains(*target))
            .map(str::to_owned)
            .collect();
        missing.sort();
        missing.dedup();
        missing
    }

    /// Hands `claimed` back for a worker that has `missing`, or fails it
    /// when none has taken it within the wait.
    pub(crate) async fn release_for_others(
        &self,
        claimed: ClaimedRun,
        missing: &[String],
    ) -> Result<Outcome, SegmentStop> {
        let job_id = claimed.job_id();
        let now = self.now();
        let since = claimed.row().unplaced_since.unwrap_or(now);
        let waited = (now - since).to_std().unwrap_or_default();
        let wait = self.settings().missing_target_wait;
        let names = missing.join(", ");
        if waited >= wait {
            let error = format!(
                "no worker with target(s) {names} claimed this job within {}; worker {} lacks them",
                humantime::format_duration(wait),
                self.settings().worker_id
            );
            tracing::error!(%job_id, %error, "job failed: its targets are missing from the fleet");
            claimed.fail(&error, None).await?;
            return Ok(Outcome::Failed(job_id));
        }
        // The pause grows with the wait: half of it so far, within bounds.
        let pause = (waited / 2).clamp(RELEASE_PAUSE_MIN, RELEASE_PAUSE_MAX);
        let reason = format!(
            "worker {} lacks target(s) {names}; handed back for a worker that has them (waiting since {since})",
            self.settings().worker_id
        );
        tracing::warn!(%job_id, %reason, "job handed back");
        claimed.release(&reason, now + pause, since).await?;
        Ok(Outcome::Released(job_id))
    }
}
