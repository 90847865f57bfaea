//! One segment: claim a job, replay its checkpoints, run its remaining steps
//! (`nodes/`) until it completes, parks, sleeps, fails, or must be
//! retried. How a step is called is [`crate::nodes::call`]; how a segment ends is
//! [`crate::run::settle`].

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::time::Instant;

use flotilla_runtime::supervise::panic_message;
use futures_util::FutureExt as _;

use flotilla_store::runs::Checkpoint;
use serde_json::{Map, Value as Json};

use crate::nodes::{Nodes, Replayed, Stop};
use crate::run::Headed;
use crate::run::claiming::claims::ClaimError;
use crate::run::compensate;
use crate::run::lease::Heartbeat;
use crate::run::retrying;
use crate::run::settle::{finish, settle, settle_as};
use crate::{ClaimedRun, SegmentStop};
use crate::{Engine, Outcome};
use flotilla_targets::StepFailure;
use flotilla_workflow::CompiledWorkflow;
use flotilla_workflow::schema_violations;

impl Engine {
    /// Runs one segment of a job handed to this process already claimed
    /// (`claiming/eager.rs`), or else claims the oldest eligible job and
    /// runs one segment of it.
    ///
    /// # Errors
    /// The claim itself failed (the database is unreachable).
    pub async fn run_once(&self) -> Result<Outcome, ClaimError> {
        // A job a submission wrote already claimed by this process goes
        // first, if at least half its lease is left.
        let fresh_until = self.now() + self.settings().lease / 2;
        let (handed, stale) = self.inner.seats.take(fresh_until);
        if !stale.is_empty() {
            self.hand_back(&stale, "after waiting for a claim loop for half its lease")
                .await;
        }
        if let Some(row) = handed {
            crate::support::telemetry::claimed(row.created_at);
            if let Some(claimed) = ClaimedRun::new(self.clone(), row) {
                return Ok(self.run_segment(claimed).await);
            }
        }
        match self.claim().await? {
            None => Ok(Outcome::Idle),
            Some(claimed) => Ok(self.run_segment(claimed).await),
        }
    }

    /// Claims the oldest eligible QUEUED job, if any, in a statement shared
    /// with this process's other loops looking for work (`claiming/claims.rs`).
    ///
    /// # Errors
    /// The claim statement failed.
    pub async fn claim(&self) -> Result<Option<ClaimedRun>, ClaimError> {
        let row = self.inner.claims.claim_one().await?;
        if let Some(row) = &row {
            crate::support::telemetry::claimed(row.run_after.max(row.created_at));
        }
        Ok(row.and_then(|row| ClaimedRun::new(self.clone(), row)))
    }

    /// Runs a claimed job until it settles or the segment must stop, renewing
    /// the lease every quarter of its term meanwhile.
    pub async fn run_segment(&self, claimed: ClaimedRun) -> Outcome {
        let job_id = claimed.job_id();
        let _in_flight = self.inner.in_flight.enter(job_id, claimed.token());
        let heartbeat = claimed.heartbeat();
        let fence = claimed.fence();
        let row = claimed.row();
        let concurrency_key = row.concurrency_key.clone();
        // One span per segment (claim to settle or park), a child of the
        // run's trace, so retries, parks and resumes on other workers all
        // join the trace the request came with.
        let span = tracing::info_span!(
            "segment",
            otel.name = format!("run {}", row.workflow_name),
            otel.kind = "internal",
            %job_id,
            workflow_name = %row.workflow_name,
            trace_id = flotilla_runtime::trace::trace_id(row.traceparent.as_deref()),
            attempt = row.attempt,
            worker_id = %self.settings().worker_id,
        );
        flotilla_runtime::trace::continue_trace(
            &span,
            row.traceparent.as_deref(),
            row.tracestate.as_deref(),
        );
        // Lines about the job after the segment are logged in its span
        // too, so they carry its job id, workflow and trace id.
        let segment =
            tracing::Instrument::instrument(self.segment(claimed, &heartbeat), span.clone());
        let outcome = match AssertUnwindSafe(segment).catch_unwind().await {
            Ok(outcome) => outcome,
            Err(panic) => {
                // A bug met by this job's data: settle it as a defect, keep the loop.
                let error = format!("the segment panicked: {}", panic_message(panic.as_ref()));
                span.in_scope(|| tracing::error!(%error, "segment panicked"));
                tracing::Instrument::instrument(fence.fail_defect(&error), span.clone())
                    .await
                    .map(|()| Outcome::Failed(job_id))
            }
        };
        // A cancel asked while the segment ran, honoured by its last write:
        // the children go with the job, as when the heartbeat saw the ask.
        let cancelled = async || {
            tracing::Instrument::instrument(self.cascade_cancel(job_id), span.clone()).await;
            Outcome::Cancelled(job_id)
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(SegmentStop::Cancelled) => cancelled().await,
            Err(SegmentStop::LeaseLost(_)) if heartbeat.lost().is_cancelled() => {
                Outcome::LeaseLost(job_id)
            }
            Err(SegmentStop::LeaseLost(_)) => {
                // The heartbeat still holds the lease, yet a commit point was
                // refused: the job changed under the segment (a graft moved
                // its sequence). Hand it back now rather than at the lapse.
                let yielded =
                    tracing::Instrument::instrument(fence.yield_changed(), span.clone()).await;
                match yielded {
                    Ok(true) => Outcome::Requeued(job_id),
                    Err(SegmentStop::Cancelled) => cancelled().await,
                    Ok(false) | Err(_) => Outcome::LeaseLost(job_id),
                }
            }
            Err(SegmentStop::Refused(_)) => Outcome::Failed(job_id),
            Err(SegmentStop::Store(e)) => {
                // A failure of the database, not of the job or this worker:
                // the job goes back as it is durable, its attempt unspent.
                let reason = format!("handed back: the store failed mid-segment: {e}");
                let handed =
                    tracing::Instrument::instrument(fence.hand_back(&reason), span.clone()).await;
                span.in_scope(|| match &handed {
                    Ok(()) => tracing::warn!(error = %e, "store failed mid-segment; job handed back"),
                    Err(SegmentStop::Cancelled) => tracing::warn!(error = %e,
                        "store failed mid-segment; job cancelled as asked instead of handed back"),
                    Err(back) => tracing::error!(error = %e, hand_back = %back,
                        "store failed mid-segment and the job could not be handed back; its lease will lapse"),
                });
                match handed {
                    Err(SegmentStop::Cancelled) => cancelled().await,
                    _ => Outcome::StoreFailed(job_id),
                }
            }
        };
        if heartbeat.lost().is_cancelled() && !matches!(outcome, Outcome::LeaseLost(_)) {
            span.in_scope(|| tracing::warn!(?outcome, "lease was lost during the segment"));
        }
        // A job that ended FAILED or DEAD closes its children as a
        // cancelled one does (each start step's `cancel_children`); a job
        // headed to compensate first is not ended yet, and keeps them.
        if matches!(outcome, Outcome::Failed(_) | Outcome::Dead(_)) {
            tracing::Instrument::instrument(self.cascade_cancel(job_id), span.clone()).await;
        }
        // A job that ended gave back its concurrency slot: the next job of
        // its key need not wait for the sweeper.
        if let Some(key) = concurrency_key.as_deref()
            && outcome.ended()
        {
            tracing::Instrument::instrument(self.slot_given_back(job_id, key), span.clone()).await;
        }
        outcome
    }

    async fn segment(
        &self,
        claimed: ClaimedRun,
        heartbeat: &Heartbeat,
    ) -> Result<Outcome, SegmentStop> {
        let (lease_lost, cancel_asked) = (heartbeat.lost(), heartbeat.cancel_asked());
        let cancel_reason = || heartbeat.cancel_reason();
        let job_id = claimed.job_id();
        let started = Instant::now();
        self.renew_if_stale(&claimed).await?;
        // Asked to cancel while it ran, and its worker went away before
        // acting on it: cancelled now, before anything is called.
        if let Some(reason) = claimed.row().cancel_requested.clone() {
            claimed.cancel(&reason).await?;
            self.cascade_cancel(job_id).await;
            return Ok(Outcome::Cancelled(job_id));
        }
        // A list past what Postgres can build (written by a release
        // without a bound on stored answers) can never be replayed.
        if let Some(unreadable) = claimed.row().unreadable.clone() {
            return settle(self, claimed, StepFailure::Defect(unreadable)).await;
        }
        let missing = self.missing_targets(&claimed.row().definition.0);
        if !missing.is_empty() {
            return self.release_for_others(claimed, &missing).await;
        }
        let claimed = match self.take_slot(claimed).await? {
            Ok(claimed) => claimed,
            Err(held) => return Ok(held),
        };
        let compiled = match self.compile_to_run(&claimed.row().definition.0).await {
            Ok(compiled) => compiled,
            Err(invalid) => {
                let error =
                    format!("the job's definition snapshot no longer compiles here: {invalid}");
                return settle(self, claimed, StepFailure::Defect(error)).await;
            }
        };
        // Checking the checkpoints against their schemas runs off the
        // runtime, as every schema validation does.
        let replayed = {
            let (compiled, checkpoints) = (compiled.clone(), claimed.row().checkpoints.0.clone());
            self.off_runtime(move || replay(&compiled, &checkpoints))
                .await
        };
        let replayed = match replayed {
            Ok(Ok(replayed)) => replayed,
            Ok(Err(error)) => return settle(self, claimed, StepFailure::Defect(error)).await,
            Err(exhausted) => {
                return settle(self, claimed, StepFailure::Defect(exhausted.to_string())).await;
            }
        };
        // A job headed to end that was compensating goes on compensating.
        if let Some(stored) = claimed.row().compensation.as_ref().map(|c| c.0.clone()) {
            let input = claimed.row().input.0.clone();
            return match compensate::under_way(&stored) {
                Ok((headed, done)) => {
                    let context = (&input, &replayed.steps);
                    compensate::compensate(
                        self,
                        claimed,
                        &compiled,
                        context,
                        (headed, done, true),
                        lease_lost,
                    )
                    .await
                }
                Err(error) => settle(self, claimed, StepFailure::Defect(error)).await,
            };
        }
        // Past its execution timeout the job ends, whatever it was doing;
        // its compensation runs as for any failure.
        if let Some(expired) = claimed.row().expires_at.filter(|at| *at <= self.now()) {
            let failure = StepFailure::Verdict {
                message: format!(
                    "timed out: the workflow's execution_timeout_ms ended the job at {}",
                    expired.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                ),
                violations: vec!["execution_timeout_ms passed".to_owned()],
            };
            return match Headed::of(&failure, None, None) {
                Some(headed) if !compiled.on_failure.is_empty() => {
                    let input = claimed.row().input.0.clone();
                    compensate::compensate(
                        self,
                        claimed,
                        &compiled,
                        (&input, &replayed.steps),
                        (headed, Map::new(), false),
                        lease_lost,
                    )
                    .await
                }
                _ => settle(self, claimed, failure).await,
            };
        }
        let nodes = Nodes {
            engine: self,
            claimed: &claimed,
            compiled: &compiled,
            input: claimed.row().input.0.clone(),
            started,
            lease_lost,
            cancel_asked,
        };
        let stop = nodes.run(replayed).await?;
        let input = nodes.input;
        match stop {
            Stop::LeaseLost => Ok(Outcome::LeaseLost(job_id)),
            Stop::Cancelled => {
                let reason = cancel_reason().unwrap_or_else(|| "cancelled while it ran".to_owned());
                claimed.cancel(&reason).await?;
                self.cascade_cancel(job_id).await;
                Ok(Outcome::Cancelled(job_id))
            }
            Stop::Failed {
                failure,
                step,
                steps,
            } => {
                let retrying = retrying::retrying(
                    self,
                    claimed.row(),
                    Some(&compiled),
                    step.as_deref(),
                    &failure,
                );
                match Headed::of(&failure, step.clone(), retrying.as_ref()) {
                    Some(headed) if !compiled.on_failure.is_empty() => {
                        let started = (headed, Map::new(), false);
                        compensate::compensate(
                            self,
                            claimed,
                            &compiled,
                            (&input, &steps),
                            started,
                            lease_lost,
                        )
                        .await
                    }
                    _ => settle_as(self, claimed, failure, (step, retrying)).await,
                }
            }
            Stop::Park {
                step,
                sleeping,
                awaited,
                children,
                replies,
            } => {
                let timers = (!sleeping.is_empty()).then(|| sleeping.newly_set());
                let wakes_at = sleeping.first().map(|(_, at)| at);
                claimed
                    .park(
                        &step,
                        (timers, wakes_at),
                        (awaited, children),
                        replies.into_inner(),
                    )
                    .await?;
                Ok(Outcome::Parked(job_id))
            }
            Stop::Sleep(sleeping) => {
                let Some((step, wakes_at)) = sleeping.first() else {
                    let error = "a sleep without a timer".to_owned();
                    return settle(self, claimed, StepFailure::Defect(error)).await;
                };
                let (step, set) = (step.to_owned(), sleeping.newly_set());
                claimed.sleep(&step, set, wakes_at).await?;
                Ok(Outcome::Sleeping(job_id))
            }
            Stop::Throttled { until, reason } => {
                tracing::debug!(%job_id, %reason, "job put off by a target's rate limit");
                claimed.hold(&reason, until).await?;
                Ok(Outcome::Held(job_id))
            }
            Stop::OutOfTime { error, written } => {
                // Progress, not a failure: a long graph or for_each runs
                // on over as many segments as it needs, its attempts kept
                // for segments that get nowhere.
                let reason = format!(
                    "{error}, after {written} checkpoint(s): resumed at once, the attempt given back"
                );
                tracing::info!(%job_id, %reason, "segment deadline reached after progress; job handed on");
                claimed.give_way(&reason).await?;
                Ok(Outcome::Requeued(job_id))
            }
            Stop::Finished { steps, last } => {
                finish(self, claimed, (&compiled, &input), steps, last, lease_lost).await
            }
        }
    }
}

impl Engine {
    /// Renews the lease, fenced, before the first step when the claim is
    /// older than a quarter of the lease (when the heartbeat would have
    /// renewed it): a claim that waited, in a busy runtime or behind a slow
    /// batch, may have lapsed and be another worker's by now, and then the
    /// segment stops before calling anything. A fresh claim is its own
    /// renewal, so the common case costs nothing.
    async fn renew_if_stale(&self, claimed: &ClaimedRun) -> Result<(), SegmentStop> {
        let since_claim = (self.now() - claimed.row().updated_at)
            .to_std()
            .unwrap_or_default();
        crate::support::telemetry::claim_to_segment(since_claim);
        if since_claim > self.settings().lease / 4 {
            claimed.renew().await?;
        }
        Ok(())
    }
}

/// Checks the stored checkpoints strictly against the definition: each
/// names a step of it, once (an item of a `for_each` step once per item,
/// the digest of its list on one item only),
/// after the checkpoints of every step it needs, and each answer fits its
/// step's output schema (a `for_each` step's, each item's).
fn replay(compiled: &CompiledWorkflow, checkpoints: &Json) -> Result<Replayed, String> {
    let entries = checkpoints
        .as_array()
        .ok_or("the checkpoints are not a JSON array")?;
    let mut replayed = Replayed {
        steps: Map::new(),
        ended: Vec::with_capacity(entries.len()),
        items: HashMap::new(),
        lists: HashMap::new(),
        pages: HashMap::new(),
        polls: HashMap::new(),
        started: HashSet::new(),
        started_items: HashMap::new(),
    };
    let mut ended = vec![false; compiled.steps.len()];
    for (i, entry) in entries.iter().enumerate() {
        let checkpoint: Checkpoint = serde_json::from_value(entry.clone())
            .map_err(|e| format!("checkpoint {i} is malformed: {e}"))?;
        let name = &checkpoint.name;
        let index = compiled.step_index(name).ok_or_else(|| {
            format!("checkpoint {i} names step {name:?}, which the workflow does not have")
        })?;
        if ended[index] {
            return Err(format!("checkpoint {i} repeats step {name:?}"));
        }
        if let Some(&need) = compiled
            .graph
            .needs(index)
            .iter()
            .find(|&&need| !ended[need])
        {
            return Err(format!(
                "checkpoint {i} ({name}) comes before one of step {:?}, which it needs",
                compiled.steps[need].definition.name
            ));
        }
        let step = &compiled.steps[index];
        if checkpoint.child.is_some() {
            // A child started: the step waits for it, and has not ended.
            if step.definition.start.is_none() {
                return Err(format!(
                    "checkpoint {i} starts a child of step {name:?}, which starts none"
                ));
            }
            match checkpoint.item {
                Some(item) => {
                    replayed
                        .started_items
                        .entry(index)
                        .or_default()
                        .insert(item as usize);
                }
                None => {
                    replayed.started.insert(index);
                }
            }
            continue;
        }
        if let Some(poll) = checkpoint.poll {
            // A call of a repeating step that was not yet the answer.
            let stored = replayed.polls.get(&index).copied().unwrap_or(0);
            if step.repeat.is_none() {
                return Err(format!(
                    "checkpoint {i} is a poll of step {name:?}, which does not repeat"
                ));
            }
            if poll != stored {
                return Err(format!(
                    "checkpoint {i} is poll {poll} of step {name:?}, after {stored} polls"
                ));
            }
            replayed.polls.insert(index, poll + 1);
            continue;
        }
        if let Some(page) = checkpoint.page {
            // A page keeps only the cursor the next one starts from.
            let stored = replayed.pages.get(&index).map_or(0, |(pages, _)| *pages);
            let cursor = checkpoint.response.get("cursor");
            match (step.definition.paged, cursor) {
                (false, _) => {
                    return Err(format!(
                        "checkpoint {i} is a page of step {name:?}, which is not paged"
                    ));
                }
                (true, None) => {
                    return Err(format!(
                        "checkpoint {i} ({name}) is a page without a cursor"
                    ));
                }
                (true, Some(_)) if page != stored => {
                    return Err(format!(
                        "checkpoint {i} is page {page} of step {name:?}, after {stored} pages"
                    ));
                }
                (true, Some(cursor)) => {
                    replayed.pages.insert(index, (page + 1, cursor.clone()));
                }
            }
            continue;
        }
        // A wait's `on_timeout` value is the author's, not an answer: the
        // schema judges answers only.
        let unjudged = checkpoint.skipped || checkpoint.timed_out;
        let answers: Vec<&Json> = match (&checkpoint.item, &step.for_each, unjudged) {
            (_, _, true) => Vec::new(),
            (Some(_), None, _) => {
                return Err(format!(
                    "checkpoint {i} is an item of step {name:?}, which has no for_each"
                ));
            }
            (None, Some(_), _) => checkpoint
                .response
                .as_array()
                .ok_or_else(|| format!("checkpoint {i} ({name}) is not the list of its items"))?
                .iter()
                .collect(),
            _ => vec![&checkpoint.response],
        };
        if let Some(schema) = &step.output_schema {
            for answer in answers {
                schema_violations(schema, answer).map_err(|violations| {
                    format!(
                        "checkpoint {i} ({name}) no longer fits the step's output schema: {}",
                        violations.join("; ")
                    )
                })?;
            }
        }
        if let Some(list) = &checkpoint.list {
            if checkpoint.item.is_none() {
                return Err(format!(
                    "checkpoint {i} ({name}) holds a list digest and is not an item"
                ));
            }
            if replayed.lists.insert(index, list.clone()).is_some() {
                return Err(format!(
                    "checkpoint {i} repeats the list digest of step {name:?}"
                ));
            }
        }
        if let Some(item) = checkpoint.item {
            let earlier = replayed.items.entry(index).or_default();
            if earlier.insert(item, checkpoint.response).is_some() {
                return Err(format!(
                    "checkpoint {i} repeats item {item} of step {name:?}"
                ));
            }
            continue;
        }
        ended[index] = true;
        replayed.ended.push(index);
        replayed.items.remove(&index);
        replayed.lists.remove(&index);
        replayed.pages.remove(&index);
        if !checkpoint.skipped {
            replayed.steps.insert(checkpoint.name, checkpoint.response);
        }
    }
    Ok(replayed)
}
