//! The path a rehearsal took, as it is printed: every call and its answer,
//! every event the job wrote (checkpoints, skips, waits, its end), every
//! retry, every answer the fixtures gave and every move of the clock, at
//! its virtual time; and how the outcome compares with the expected one.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_contracts::{WorkflowRunEvent, WorkflowRunEventType};
use flotilla_engine::rows::{RunRow, RunStatus};
use flotilla_targets::StepFailure;
use serde_json::Value as Json;
use uuid::Uuid;

use crate::answers::Call;
use crate::fixtures::Expect;

/// One line of the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Virtual time since the job was submitted.
    pub at: Duration,
    /// The child workflow the line is about; `None` for the job itself.
    pub child: Option<String>,
    pub text: String,
}

/// What a rehearsal came to.
#[derive(Debug, Clone)]
pub struct Rehearsal {
    pub job_id: Uuid,
    pub workflow: String,
    pub lines: Vec<Line>,
    pub state: RunStatus,
    pub result: Option<Json>,
    pub verdict: Option<String>,
    pub error: Option<String>,
    /// Calls per step, every run of the family counted.
    pub calls: BTreeMap<String, usize>,
    /// Calls per step and part (`price:item-0`; a whole step's as `step`),
    /// as a target's idempotency key names them.
    pub calls_by_part: BTreeMap<String, usize>,
    /// The job's steps skipped by their `when`.
    pub skipped: Vec<String>,
    /// Virtual time from submission to the end.
    pub elapsed: Duration,
    /// Why the job could not go on, when it did not finish.
    pub stalled: Option<String>,
    /// Steps called with no answer in the fixtures.
    pub unanswered: Vec<String>,
}

impl Rehearsal {
    /// How the outcome differs from `expect`, each difference in words;
    /// empty when it matches. A run that could not go on, or called a step
    /// the fixtures do not answer, never matches.
    #[must_use]
    pub fn mismatches(&self, expect: Option<&Expect>) -> Vec<String> {
        let mut differ = Vec::new();
        if let Some(why) = &self.stalled {
            differ.push(format!("the job did not finish: {why}"));
        }
        for step in dedup(&self.unanswered) {
            differ.push(format!(
                "step {step} was called and the fixtures hold no answer for it (answers.{step})"
            ));
        }
        let Some(expect) = expect else { return differ };
        if self.state.as_str() != expect.state {
            differ.push(format!(
                "state: expected {}, got {}",
                expect.state, self.state
            ));
        }
        if let Some(result) = &expect.result
            && self.result.as_ref() != Some(result)
        {
            differ.push(format!(
                "result: expected {result}, got {}",
                self.result
                    .as_ref()
                    .map_or("none".to_owned(), Json::to_string)
            ));
        }
        if let Some(text) = &expect.verdict {
            let said = [&self.verdict, &self.error]
                .into_iter()
                .flatten()
                .any(|said| said.contains(text.as_str()));
            if !said {
                differ.push(format!(
                    "verdict: expected one containing {text:?}, got verdict {:?}, error {:?}",
                    self.verdict, self.error
                ));
            }
        }
        for (step, expected) in &expect.calls {
            let got = self.calls.get(step).copied().unwrap_or(0);
            if got != *expected {
                differ.push(format!("calls.{step}: expected {expected}, got {got}"));
            }
        }
        for step in &expect.skipped {
            if !self.skipped.contains(step) {
                differ.push(format!(
                    "skipped: expected {step} to be skipped, it was not"
                ));
            }
        }
        differ
    }

    /// The path, one line per thing that happened, and the outcome.
    #[must_use]
    pub fn render(&self) -> String {
        let mut text = format!("{} (job {})\n", self.workflow, self.job_id);
        for line in &self.lines {
            let at = format!("+{}", humantime::format_duration(line.at));
            let child = line
                .child
                .as_ref()
                .map(|w| format!("[child {w}] "))
                .unwrap_or_default();
            let _ = writeln!(text, "{at:>10}  {child}{}", line.text);
        }
        let _ = writeln!(
            text,
            "outcome: {} after {} of virtual time",
            self.state,
            humantime::format_duration(self.elapsed)
        );
        if let Some(result) = &self.result {
            let _ = writeln!(text, "result: {result}");
        }
        if let Some(verdict) = &self.verdict {
            let _ = writeln!(text, "verdict: {verdict}");
        }
        if let Some(error) = &self.error
            && self.state != RunStatus::Completed
        {
            let _ = writeln!(text, "error: {error}");
        }
        text
    }
}

fn dedup(items: &[String]) -> Vec<&String> {
    let mut seen = HashSet::new();
    items.iter().filter(|i| seen.insert(*i)).collect()
}

/// The path as it is seen, segment after segment.
#[derive(Debug)]
pub(crate) struct PathLog {
    job_id: Uuid,
    start: DateTime<Utc>,
    lines: Vec<Line>,
    calls_seen: usize,
    /// Calls so far by (job, step, part): a repeat is a retry.
    made: BTreeMap<(Uuid, String, Option<String>), usize>,
    events_seen: HashSet<(Uuid, i64)>,
    /// Child job → its workflow.
    children: BTreeMap<Uuid, String>,
}

impl PathLog {
    pub(crate) fn new(job_id: Uuid, start: DateTime<Utc>) -> Self {
        Self {
            job_id,
            start,
            lines: Vec::new(),
            calls_seen: 0,
            made: BTreeMap::new(),
            events_seen: HashSet::new(),
            children: BTreeMap::new(),
        }
    }

    fn since(&self, at: DateTime<Utc>) -> Duration {
        let since = (at - self.start).to_std().unwrap_or_default();
        // Milliseconds are what a workflow's durations are written in.
        Duration::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }

    fn push(&mut self, at: DateTime<Utc>, job: Uuid, text: String) {
        let line = Line {
            at: self.since(at),
            child: (job != self.job_id).then(|| {
                self.children
                    .get(&job)
                    .cloned()
                    .unwrap_or_else(|| job.to_string())
            }),
            text,
        };
        self.lines.push(line);
    }

    /// The calls and events since the last look. The job whose segment
    /// `ran` comes first, its calls placed among its events by the event
    /// each followed; then what other runs of the family wrote meanwhile
    /// (a child created, a parent woken).
    pub(crate) fn saw(
        &mut self,
        ran: Option<Uuid>,
        calls: &[Call],
        events: &[WorkflowRunEvent],
        rows: &std::collections::HashMap<Uuid, RunRow>,
    ) {
        for row in rows.values() {
            if row.job_id != self.job_id {
                self.children.insert(row.job_id, row.workflow_name.clone());
            }
        }
        let mut fresh: Vec<(Order, Seen<'_>)> = Vec::new();
        for call in calls.iter().skip(self.calls_seen) {
            let key = (
                Some(call.job_id) != ran,
                call.at,
                call.job_id,
                call.after_event,
                true,
            );
            fresh.push((key, Seen::Call(call)));
        }
        self.calls_seen = calls.len();
        for event in events {
            if self.events_seen.insert((event.job_id(), event.sequence())) {
                let key = (
                    Some(event.job_id()) != ran,
                    event.occurred_at(),
                    event.job_id(),
                    event.sequence(),
                    false,
                );
                fresh.push((key, Seen::Event(event)));
            }
        }
        // A stable sort: calls made at one point keep the order they were made in.
        fresh.sort_by_key(|(key, _)| *key);
        for (_, seen) in fresh {
            match seen {
                Seen::Call(call) => self.call(call),
                Seen::Event(event) => {
                    let text = self.event_text(event, rows.get(&event.job_id()));
                    self.push(event.occurred_at(), event.job_id(), text);
                }
            }
        }
    }

    fn call(&mut self, call: &Call) {
        let key = (call.job_id, call.step.clone(), call.part.clone());
        let made = self.made.entry(key).or_default();
        *made += 1;
        let nth = *made;
        let part = call
            .part
            .as_ref()
            .map(|p| format!(" {p}"))
            .unwrap_or_default();
        let again = if nth > 1 {
            format!(" (call {nth})")
        } else {
            String::new()
        };
        let text = format!(
            "call {}{part}{again} {} -> {}",
            call.step,
            call.request,
            answered(&call.answered)
        );
        self.push(call.at, call.job_id, text);
    }

    fn event_text(&self, event: &WorkflowRunEvent, row: Option<&RunRow>) -> String {
        let step = event.step_name().unwrap_or_default();
        let note = event.verdict();
        match event.event_type() {
            WorkflowRunEventType::Accepted => match note {
                Some(note) => note.to_owned(),
                None => format!("accepted (attempt {})", event.attempt().max(1)),
            },
            WorkflowRunEventType::StepCheckpoint => match note {
                Some("skipped") => format!("skipped {step} (its when was false)"),
                Some(note) => format!("checkpoint {step} ({note})"),
                None => {
                    let response = row
                        .and_then(|row| checkpoint_of(row, step))
                        .map(|r| format!(" {r}"))
                        .unwrap_or_default();
                    format!("checkpoint {step}{response}")
                }
            },
            WorkflowRunEventType::Waiting => match note
                .and_then(|n| n.strip_prefix("sleeping until "))
            {
                Some(until) => {
                    let until = DateTime::parse_from_rfc3339(until)
                        .map(|t| format!("+{}", humantime::format_duration(self.since(t.into()))))
                        .unwrap_or_else(|_| until.to_owned());
                    format!("sleeping at {step} until {until}")
                }
                None => format!("waiting at {step}"),
            },
            WorkflowRunEventType::Completed => format!(
                "COMPLETED {}",
                event
                    .result()
                    .map_or("(no result)".to_owned(), Json::to_string)
            ),
            WorkflowRunEventType::Failed => {
                format!("FAILED: {}", event.error().unwrap_or_default())
            }
            WorkflowRunEventType::Dead => format!("DEAD: {}", event.error().unwrap_or_default()),
            WorkflowRunEventType::Cancelled => {
                format!("CANCELLED: {}", event.error().unwrap_or_default())
            }
            WorkflowRunEventType::Unspecified => "an event of an unknown type".to_owned(),
        }
    }

    /// A run was put back in the queue after a failure that retries.
    pub(crate) fn requeued(&mut self, row: &RunRow) {
        let when = if row.run_after > self.start {
            format!("+{}", humantime::format_duration(self.since(row.run_after)))
        } else {
            "at once".to_owned()
        };
        let why = row
            .error
            .as_deref()
            .unwrap_or("its segment ran out of time");
        let text = format!(
            "retry: attempt {} of {} {when}: {why}",
            row.attempt + 1,
            row.max_attempts
        );
        self.push(row.updated_at, row.job_id, text);
    }

    pub(crate) fn clock_moved(&mut self, to: DateTime<Utc>) {
        let text = format!(
            "clock moves to +{} (nothing runs before)",
            humantime::format_duration(self.since(to))
        );
        self.push(to, self.job_id, text);
    }

    pub(crate) fn gave(&mut self, job: Uuid, what: String, at: DateTime<Utc>) {
        self.push(at, job, format!("given {what}"));
    }

    pub(crate) fn finish(
        self,
        top: &RunRow,
        now: DateTime<Utc>,
        stalled: Option<String>,
        unanswered: Vec<String>,
    ) -> Rehearsal {
        let calls = self
            .made
            .iter()
            .fold(BTreeMap::new(), |mut by_step, ((_, step, _), made)| {
                *by_step.entry(step.clone()).or_default() += made;
                by_step
            });
        let calls_by_part =
            self.made
                .iter()
                .fold(BTreeMap::new(), |mut by_part, ((_, step, part), made)| {
                    let key = match part {
                        Some(part) => format!("{step}:{part}"),
                        None => step.clone(),
                    };
                    *by_part.entry(key).or_default() += made;
                    by_part
                });
        let skipped = top
            .checkpoints
            .0
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["skipped"] == true)
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect();
        let end = if top.status.is_finished() {
            top.updated_at
        } else {
            now
        };
        Rehearsal {
            job_id: self.job_id,
            workflow: top.workflow_name.clone(),
            elapsed: self.since(end),
            lines: self.lines,
            state: top.status,
            result: top.result.as_ref().map(|r| r.0.clone()),
            verdict: top.verdict.clone(),
            error: top.error.clone(),
            calls,
            calls_by_part,
            skipped,
            stalled,
            unanswered,
        }
    }
}

/// Where a fresh line goes: the job that ran first, then by time, job and
/// event sequence, a call after the event it followed.
type Order = (bool, DateTime<Utc>, Uuid, i64, bool);

/// A call or an event, not yet printed.
enum Seen<'a> {
    Call(&'a Call),
    Event(&'a WorkflowRunEvent),
}

/// A step's answer in the row, as checkpointed.
fn checkpoint_of(row: &RunRow, step: &str) -> Option<Json> {
    row.checkpoints
        .0
        .as_array()?
        .iter()
        .rev()
        .find(|c| {
            c["name"] == step
                && c.get("item").is_none()
                && c.get("page").is_none()
                && c.get("poll").is_none()
                && c["skipped"] != true
        })
        .map(|c| c["response"].clone())
}

fn answered(answered: &Result<Json, StepFailure>) -> String {
    match answered {
        Ok(response) => response.to_string(),
        Err(StepFailure::Retryable {
            error,
            class,
            after,
            ..
        }) => match after {
            Some(after) => format!(
                "retryable ({}, retry after {}): {error}",
                class.label(),
                humantime::format_duration(*after)
            ),
            None => format!("retryable ({}): {error}", class.label()),
        },
        Err(StepFailure::Verdict { message, .. }) => format!("verdict: {message}"),
        Err(StepFailure::Defect(error)) => format!("defect: {error}"),
    }
}
