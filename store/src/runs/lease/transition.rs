//! The fenced changes a lease holder makes to its RUNNING row: [`Fence`]
//! (what a write is conditioned on) and [`Transition`] (each change, with
//! the SQL it sets and the event it carries).

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::outbox::EventKind;
use crate::runs::{Checkpoint, CheckpointLayout};

/// What a lease holder's write is conditioned on: its lease token, and
/// for a write that commits an event, the event sequence the holder last
/// saw, so a write repeated after an ambiguous commit can never append a
/// second time (compare-and-set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub token: Uuid,
    /// The row's `event_sequence` before this write, less its
    /// `foreign_events` and its `revision` (the events its holder did not
    /// write: signals received, grafts).
    pub sequence: i64,
    /// The definition's revision the holder runs: a write that ends the
    /// segment's graph (a park, a sleep, a completion) is refused once a
    /// graft moved it, so the job resumes with the grafted steps; its
    /// checkpoints are not, so the answers in hand are kept.
    pub revision: i32,
}

/// A change to a RUNNING row by its lease holder. Each one states the event
/// it commits, so a transition cannot be written without its outbox row.
/// One that takes the job out of RUNNING writes CANCELLED (and its event)
/// instead when a cancel was asked while the segment ran.
/// Owned, so a writer can hand it to a shared commit and wait.
#[derive(Debug, Clone)]
pub enum Transition {
    /// Adds a checkpoint (event: STEP_CHECKPOINT), in `layout` unless the
    /// run already keeps its checkpoints as rows.
    Checkpoint {
        checkpoint: Checkpoint,
        layout: CheckpointLayout,
    },
    /// Parks on an external or a `wait_for` step (event: WAITING).
    /// `timers` (step → instant) reached in the same segment are added to
    /// the row's, so they keep their instants while the job waits.
    /// `signals`: the names the job's ready `wait_for` steps wait for; one
    /// of them received while the segment ran (its signal unseen by the
    /// claim) requeues the job at once instead, so it is taken.
    Park {
        step: String,
        timers: Option<serde_json::Value>,
        signals: Vec<String>,
        /// The steps whose children the job waits for: one that finished
        /// meanwhile requeues the job at once too.
        children: Vec<String>,
        /// Requests to Kafka targets sent by this park (their outbox rows
        /// written in its transaction) and the replies it waits for: one
        /// matched meanwhile requeues the job at once too.
        replies: crate::runs::step_requests::AwaitedReplies,
        /// The earliest timer reached and not yet passed: the job is put
        /// back in the queue then, whatever it waits for.
        wakes_at: Option<DateTime<Utc>>,
    },
    /// Back to the queue until the first of the run's timers wakes (event:
    /// WAITING on `step`, saying until when), attempt given back, no lease
    /// held; `timers` (step → instant) are added to the row's.
    Sleep {
        step: String,
        timers: serde_json::Value,
        wakes_at: DateTime<Utc>,
    },
    /// Starts compensating: the job is headed to end with `failure`
    /// (`{step, error, verdict, ends}`); no event.
    BeginCompensation { failure: serde_json::Value },
    /// Keeps the instants of timers just reached (step → instant), added
    /// to the row's: whatever ends the segment, they do not start again.
    /// No event.
    KeepTimers { timers: serde_json::Value },
    /// A compensation step answered (event: STEP_CHECKPOINT noted
    /// `compensation`).
    Compensated { checkpoint: Checkpoint },
    /// Finishes (event: COMPLETED).
    Complete {
        result: serde_json::Value,
        verdict: String,
    },
    /// The last step's checkpoint and the completion in one write (events:
    /// STEP_CHECKPOINT, then COMPLETED): one commit, one row version and
    /// one lock of the row fewer than the two written apart. The checkpoint
    /// goes where the run's others are, whatever the engine's layout: a
    /// row after its rows, or, for a run with none (a 1-step job), its
    /// array, which this write rewrites anyway; so a 1-step job writes no
    /// checkpoint row nor its index entry.
    CheckpointAndComplete {
        checkpoint: Checkpoint,
        result: serde_json::Value,
        verdict: String,
    },
    /// Fails for good (event: FAILED).
    Fail {
        error: String,
        verdict: Option<String>,
    },
    /// Attempts exhausted (event: DEAD).
    Dead { error: String },
    /// Cancelled as someone asked while it ran (event: CANCELLED).
    Cancel { reason: String },
    /// Back to the queue after a retryable failure (no event: retries are
    /// not commit points).
    Requeue {
        error: String,
        run_after: DateTime<Utc>,
        /// The step whose failure this is: its failed attempts count one more.
        step: Option<String>,
    },
    /// Handed back by a worker that lacks a target the job needs, for one
    /// that has it: no attempt spent, no event; `since` starts the wait.
    Release {
        reason: String,
        run_after: DateTime<Utc>,
        since: DateTime<Utc>,
    },
    /// Handed back because every slot of its concurrency key is held: no
    /// attempt spent, no event; eligible again at `run_after` (a holder
    /// that ends wakes it sooner, see `runs::concurrency`).
    Hold {
        reason: String,
        run_after: DateTime<Utc>,
    },
    /// Handed back at once by a worker whose job changed under it (a graft
    /// moved its event sequence, so its next commit point was refused), or
    /// whose segment met its deadline after writing checkpoints (progress,
    /// not a failure): no attempt spent, no lapse counted, no backoff, no
    /// event; fenced on the lease token only.
    Yield { reason: String },
    /// Handed back by a worker that cannot go on with it for a reason of
    /// the world (the database failed mid-segment): no attempt spent, no
    /// lapse counted, no event; eligible again `backoff × 2^(hand-backs in
    /// a row)` (at most 64 times `backoff`) after `now`.
    HandBack {
        reason: String,
        now: DateTime<Utc>,
        backoff: std::time::Duration,
    },
}

impl Transition {
    /// The event this transition commits, if it is a commit point.
    pub(super) fn event(&self) -> Option<EventKind> {
        Some(match self {
            Self::Checkpoint { checkpoint, .. } => EventKind::StepCheckpoint {
                step: checkpoint.name.clone(),
                note: checkpoint.note(),
            },
            Self::Park { step, .. } => EventKind::Waiting { step: step.clone() },
            Self::Compensated { checkpoint } => EventKind::StepCheckpoint {
                step: checkpoint.name.clone(),
                note: Some(flotilla_contracts::COMPENSATION.to_owned()),
            },
            Self::Sleep { step, wakes_at, .. } => EventKind::Sleeping {
                step: step.clone(),
                until: *wakes_at,
            },
            Self::Complete { result, verdict }
            | Self::CheckpointAndComplete {
                result, verdict, ..
            } => EventKind::Completed {
                verdict: verdict.clone(),
                result: result.clone(),
            },
            Self::Fail { error, verdict } => EventKind::Failed {
                error: error.clone(),
                verdict: verdict.clone(),
            },
            Self::Dead { error } => EventKind::Dead {
                error: error.clone(),
            },
            Self::Cancel { reason } => EventKind::Cancelled {
                reason: reason.clone(),
            },
            Self::Requeue { .. }
            | Self::Release { .. }
            | Self::Hold { .. }
            | Self::HandBack { .. }
            | Self::Yield { .. }
            | Self::BeginCompensation { .. }
            | Self::KeepTimers { .. } => return None,
        })
    }

    /// Whether this transition commits an event.
    #[must_use]
    pub fn is_commit_point(&self) -> bool {
        self.events_written() > 0
    }

    /// How many events (and so event sequences) this transition writes.
    #[must_use]
    pub fn events_written(&self) -> i64 {
        match self {
            Self::Requeue { .. }
            | Self::Release { .. }
            | Self::Hold { .. }
            | Self::HandBack { .. }
            | Self::Yield { .. }
            | Self::BeginCompensation { .. }
            | Self::KeepTimers { .. } => 0,
            Self::CheckpointAndComplete { .. } => 2,
            _ => 1,
        }
    }

    /// Whether this transition is where the segment's graph ends (a park,
    /// a sleep, a completion): what it decides depends on every step of
    /// the definition, so a graft since the claim refuses it.
    pub(super) fn ends_the_graph(&self) -> bool {
        matches!(
            self,
            Self::Park { .. }
                | Self::Sleep { .. }
                | Self::Complete { .. }
                | Self::CheckpointAndComplete { .. }
        )
    }

    /// Whether this transition takes the job out of RUNNING (and so
    /// honours a cancel asked while its segment ran: [`out_of_running`]).
    pub(super) fn leaves_running(&self) -> bool {
        !matches!(
            self,
            Self::Checkpoint { .. }
                | Self::BeginCompensation { .. }
                | Self::KeepTimers { .. }
                | Self::Compensated { .. }
                | Self::Cancel { .. }
        )
    }

    /// The SET clause; parameters from `$5` on are bound by [`transition`].
    pub(super) fn assignments(&self) -> String {
        // Every transition is the work going on: lapses before it no longer count.
        let next = || {
            [
                ("event_sequence", "event_sequence + 1"),
                ("lease_losses", "0"),
                ("hand_backs", "0"),
                ("unplaced_since", "NULL"),
            ]
        };
        let release = || {
            [
                ("lease_owner", "NULL"),
                ("lease_token", "NULL"),
                ("lease_until", "NULL"),
            ]
        };
        let (mut set, also): (Vec<(&str, Cow<str>)>, Option<String>) = match self {
            Self::Checkpoint { layout, .. } => {
                let also = format!(
                    "{}, {}",
                    layout.assignment("$5"),
                    crate::runs::signals::TAKE_SIGNAL
                );
                (lit(&next()), Some(also))
            }
            Self::Park { .. } => {
                let woken = park_woken();
                let if_woken = |then: &str, otherwise: &str| -> Cow<str> {
                    format!("CASE WHEN {woken} THEN {then} ELSE {otherwise} END").into()
                };
                let set = vec![
                    ("status", if_woken("'QUEUED'", "'WAITING'")),
                    ("outstanding_step", if_woken("NULL", "$5")),
                    ("run_after", if_woken("$3", "run_after")),
                    ("attempt", if_woken("greatest(attempt - 1, 0)", "attempt")),
                    (
                        "timers",
                        "CASE WHEN $6::jsonb IS NULL THEN timers \
                         ELSE coalesce(timers, '{}'::jsonb) || $6 END"
                            .into(),
                    ),
                    (
                        "step_requests",
                        "CASE WHEN $9::jsonb IS NULL THEN step_requests \
                         ELSE coalesce(step_requests, '{}'::jsonb) || $9 END"
                            .into(),
                    ),
                    ("reply_deadline", if_woken("NULL", "$11")),
                    ("wake_at", if_woken("NULL", "$12")),
                ];
                (set, None)
            }
            Self::Sleep { .. } => (
                lit(&[
                    ("status", "'QUEUED'"),
                    ("timers", "coalesce(timers, '{}'::jsonb) || $5"),
                    ("run_after", "$6"),
                    ("attempt", "greatest(attempt - 1, 0)"),
                    ("error", "NULL"),
                ]),
                None,
            ),
            Self::BeginCompensation { .. } => {
                return "compensation = jsonb_build_object('failure', $5::jsonb, 'done', '[]'::jsonb), \
                     lease_losses = 0, hand_backs = 0"
                    .to_owned();
            }
            Self::KeepTimers { .. } => {
                return "timers = coalesce(timers, '{}'::jsonb) || $5".to_owned();
            }
            Self::Compensated { .. } => {
                let mut set = lit(&[(
                    "compensation",
                    "jsonb_set(compensation, '{done}', \
                         (compensation -> 'done') || jsonb_build_array($5::jsonb))",
                )]);
                set.extend(lit(&next()));
                (set, None)
            }
            Self::Complete { .. } => (
                lit(&[
                    ("status", "'COMPLETED'"),
                    ("result", "$5"),
                    ("verdict", "$6"),
                    ("error", "NULL"),
                ]),
                None,
            ),
            Self::CheckpointAndComplete { .. } => (
                lit(&[
                    ("status", "'COMPLETED'"),
                    ("result", "$6"),
                    ("verdict", "$7"),
                    ("error", "NULL"),
                    ("event_sequence", "event_sequence + 2"),
                    ("lease_losses", "0"),
                    ("hand_backs", "0"),
                    ("unplaced_since", "NULL"),
                ]),
                Some(format!(
                    "{}, {}",
                    CheckpointLayout::Array.assignment("$5"),
                    crate::runs::signals::TAKE_SIGNAL
                )),
            ),
            Self::Fail { .. } => (
                lit(&[("status", "'FAILED'"), ("error", "$5"), ("verdict", "$6")]),
                None,
            ),
            Self::Dead { .. } => (lit(&[("status", "'DEAD'"), ("error", "$5")]), None),
            Self::Cancel { .. } => (
                lit(&[
                    ("status", "'CANCELLED'"),
                    ("error", "$5"),
                    ("outstanding_step", "NULL"),
                ]),
                None,
            ),
            Self::Requeue { .. } => (
                lit(&[
                    ("status", "'QUEUED'"),
                    ("error", "$5"),
                    ("run_after", "$6"),
                    ("lease_losses", "0"),
                    ("unplaced_since", "NULL"),
                    (
                        "failed_attempts",
                        "CASE WHEN $7::text IS NULL THEN failed_attempts \
                         ELSE failed_attempts || jsonb_build_object($7::text, \
                              CASE WHEN jsonb_typeof(failed_attempts -> $7::text) = 'number' \
                              THEN (failed_attempts ->> $7::text)::numeric ELSE 0 END + 1) END",
                    ),
                ]),
                Some(crate::runs::children::FORGET_DEAD.to_owned()),
            ),
            Self::Release { .. } => (
                lit(&[
                    ("status", "'QUEUED'"),
                    ("error", "$5"),
                    ("run_after", "$6"),
                    ("attempt", "greatest(attempt - 1, 0)"),
                    ("unplaced_since", "coalesce(unplaced_since, $7)"),
                ]),
                None,
            ),
            Self::Hold { .. } => (
                lit(&[
                    ("status", "'QUEUED'"),
                    ("error", "$5"),
                    ("run_after", "$6"),
                    ("attempt", "greatest(attempt - 1, 0)"),
                ]),
                None,
            ),
            Self::Yield { .. } => (
                lit(&[
                    ("status", "'QUEUED'"),
                    ("error", "$5"),
                    ("run_after", "$3"),
                    ("attempt", "greatest(attempt - 1, 0)"),
                ]),
                None,
            ),
            Self::HandBack { .. } => (
                lit(&[
                    ("status", "'QUEUED'"),
                    ("error", "$5"),
                    (
                        "run_after",
                        "$6 + least(power(2, hand_backs), 64) * $7 * interval '1 millisecond'",
                    ),
                    ("hand_backs", "hand_backs + 1"),
                    ("attempt", "greatest(attempt - 1, 0)"),
                ]),
                None,
            ),
        };
        // Transitions out of RUNNING release the lease; the commit points
        // among them are the work going on.
        if self.leaves_running() || matches!(self, Self::Cancel { .. }) {
            set.extend(lit(&release()));
            if self.is_commit_point() && !matches!(self, Self::CheckpointAndComplete { .. }) {
                set.extend(lit(&next()));
            }
            if matches!(self, Self::Park { .. }) {
                // A woken park leaves no WAITING event (the job never
                // waited), so it takes no sequence; cancelled instead, it
                // takes one for its CANCELLED event.
                let sequence = format!(
                    "event_sequence + CASE WHEN {} AND NOT {ASKED} THEN 0 ELSE 1 END",
                    park_woken()
                );
                for (column, value) in &mut set {
                    if *column == "event_sequence" {
                        *value = sequence.clone().into();
                    }
                }
            }
        }
        let set = if self.leaves_running() {
            out_of_running(&set)
        } else {
            set.iter()
                .map(|(column, value)| format!("{column} = {value}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match also {
            Some(also) => format!("{set}, {also}"),
            None => set,
        }
    }
}

/// Whether a park finds what it would wait for there already: one of the
/// signals, finished children or replies it names (parameters 7, 8, 10).
/// Then the job goes back to the queue instead of WAITING.
fn park_woken() -> String {
    format!(
        "({} OR {} OR {})",
        crate::runs::signals::PENDING_ONE_OF_7,
        crate::runs::children::FINISHED_ONE_OF_8,
        crate::runs::step_requests::REPLIED_ONE_OF_10
    )
}

/// `(column, value)` pairs of literal SQL, as a SET clause is built.
fn lit(pairs: &[(&'static str, &'static str)]) -> Vec<(&'static str, Cow<'static, str>)> {
    pairs
        .iter()
        .map(|&(column, value)| (column, value.into()))
        .collect()
}

/// Whether someone asked to cancel the job while it ran.
const ASKED: &str = "cancel_requested IS NOT NULL";

/// What a transition out of RUNNING writes instead when [`ASKED`]: what
/// [`Transition::Cancel`] writes, the reason asked as the error. `None`:
/// the column as it was (not what the transition meant to set).
const CANCELLED_INSTEAD: &[(&str, Option<&str>)] = &[
    ("status", Some("'CANCELLED'")),
    ("error", Some("cancel_requested")),
    ("outstanding_step", Some("NULL")),
    ("lease_losses", Some("0")),
    ("hand_backs", Some("0")),
    // Typed: a CASE of two bare NULLs is text.
    ("unplaced_since", Some("NULL::timestamptz")),
    ("result", None),
    ("verdict", None),
    ("run_after", None),
    ("attempt", None),
    ("failed_attempts", None),
    ("timers", None),
    ("step_requests", None),
    ("reply_deadline", None),
    ("wake_at", None),
];

/// The SET clause of a transition out of RUNNING: `set` (column, value)
/// where no cancel was asked, and CANCELLED (as [`Transition::Cancel`]
/// writes it, with one event more) where one was. A cancel is asked of
/// RUNNING rows only (`request_cancel`), and the row lock orders the ask
/// and this write: an ask this statement does not see finds the row no
/// longer RUNNING, so none is left behind on a row no worker holds.
fn out_of_running(set: &[(&str, Cow<str>)]) -> String {
    let mut out: Vec<String> = set
        .iter()
        .map(
            |(column, value)| match CANCELLED_INSTEAD.iter().find(|(c, _)| c == column) {
                Some((_, instead)) => format!(
                    "{column} = CASE WHEN {ASKED} THEN {} ELSE {value} END",
                    instead.unwrap_or(*column)
                ),
                None => format!("{column} = {value}"),
            },
        )
        .collect();
    for (column, instead) in CANCELLED_INSTEAD {
        if let Some(instead) = instead
            && !set.iter().any(|(c, _)| c == column)
        {
            out.push(format!(
                "{column} = CASE WHEN {ASKED} THEN {instead} ELSE {column} END"
            ));
        }
    }
    if !set.iter().any(|(c, _)| *c == "event_sequence") {
        // Not a commit point, unless it is cancelled instead.
        out.push(format!(
            "event_sequence = event_sequence + CASE WHEN {ASKED} THEN 1 ELSE 0 END"
        ));
    }
    out.join(", ")
}
