//! Leased rows: the claim, the fenced writes of the lease holder, and the
//! sweep of leases that lapsed.
//!
//! Every write to a RUNNING row is conditioned on the lease token it was
//! claimed with (a fresh UUID per claim, never reused); a write that matches
//! no row means the lease is gone and nothing was written.
//!
//! A cancel asked of a RUNNING job (`request_cancel`) is honoured by
//! whatever takes the job out of RUNNING next: its holder's transition
//! (CANCELLED instead of parked, asleep, finished or queued again), or the
//! sweep of its lapsed lease. Only a shutdown's `hand_back_all` leaves the
//! ask on the QUEUED row, eligible at once: the next claim honours it
//! before anything is called.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgTransaction};
use uuid::Uuid;

use super::{
    COLUMNS, COLUMNS_BUT_CHECKPOINT_ROWS, Checkpoint, CheckpointLayout, RunRow, STAMP,
    checkpoint_write, reread_checkpoint_rows,
};
use crate::StoreError;
use crate::outbox::{self, EventKind, EventStamp};

/// Claims up to `limit` of the oldest eligible QUEUED rows this release
/// can read ([`super::READER_LEVEL`]) in one statement: flips them to RUNNING, stamps the lease and a fresh token per
/// row (never reused), and counts the attempt. Rows come back oldest first,
/// the checkpoint rows of resumed runs read in a second statement
/// (see `reread_checkpoint_rows`): a run whose list Postgres cannot build
/// comes back with [`RunRow::unreadable`] set, beside the others.
///
/// # Errors
/// Database errors.
pub async fn claim(
    conn: &mut PgConnection,
    worker_id: &str,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<RunRow>, sqlx::Error> {
    let mut rows: Vec<RunRow> = crate::sql::query_as(&format!(
        "WITH picked AS (
             SELECT job_id AS picked_id FROM workflow_run
             WHERE status = 'QUEUED' AND run_after <= $2 AND reader_level <= $5
             ORDER BY run_after, created_at
             LIMIT $4
             FOR UPDATE SKIP LOCKED)
         UPDATE workflow_run SET status = 'RUNNING', lease_owner = $1,
             lease_token = gen_random_uuid(), lease_until = $3,
             attempt = attempt + 1, updated_at = $2, wake_at = NULL
         FROM picked WHERE job_id = picked_id
         RETURNING {COLUMNS_BUT_CHECKPOINT_ROWS}"
    ))
    .bind(worker_id)
    .bind(now)
    .bind(lease_until)
    .bind(limit)
    .bind(super::READER_LEVEL)
    .fetch_all(&mut *conn)
    .await?;
    reread_checkpoint_rows(conn, &mut rows).await?;
    rows.sort_by_key(|row| (row.run_after, row.created_at));
    Ok(rows)
}

/// Extends the lease of `token` on `job_id`; `false` when the lease is gone.
///
/// # Errors
/// Database errors.
pub async fn renew(
    conn: &mut PgConnection,
    job_id: Uuid,
    token: Uuid,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
) -> Result<Renewal, sqlx::Error> {
    let renewed: Option<(Option<String>,)> = crate::sql::query_as(
        "UPDATE workflow_run SET lease_until = $4, updated_at = $3
         WHERE job_id = $1 AND lease_token = $2 AND status = 'RUNNING'
         RETURNING cancel_requested",
    )
    .bind(job_id)
    .bind(token)
    .bind(now)
    .bind(lease_until)
    .fetch_optional(conn)
    .await?;
    Ok(match renewed {
        None => Renewal::Lost,
        Some((None,)) => Renewal::Held,
        Some((Some(reason),)) => Renewal::CancelAsked(reason),
    })
}

/// What a renewal found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    Held,
    /// Another worker holds the job, or it is no longer RUNNING.
    Lost,
    /// Still held, and someone asked to cancel the job: their reason.
    CancelAsked(String),
}

/// Asks the worker running `job_id` to cancel it with `reason`: recorded in
/// the row (the first ask is kept), no event, nothing the holder's fence
/// compares. `None`: the job is not RUNNING. The holder's heartbeat sees
/// the ask; its next transition out of RUNNING honours it in any case
/// (see [`Written::Cancelled`]), so a segment that parks, sleeps, ends or
/// hands the job back first still leaves it CANCELLED.
///
/// # Errors
/// Database errors.
pub async fn request_cancel(
    conn: &mut PgConnection,
    job_id: Uuid,
    reason: &str,
) -> Result<Option<super::RunRow>, sqlx::Error> {
    crate::sql::query_as(&format!(
        "UPDATE workflow_run SET cancel_requested = coalesce(cancel_requested, $2)
         WHERE job_id = $1 AND status = 'RUNNING'
         RETURNING {COLUMNS}"
    ))
    .bind(job_id)
    .bind(reason)
    .fetch_optional(conn)
    .await
}

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
        replies: super::step_requests::AwaitedReplies,
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
    },
    /// Handed back by a worker that lacks a target the job needs, for one
    /// that has it: no attempt spent, no event; `since` starts the wait.
    Release {
        reason: String,
        run_after: DateTime<Utc>,
        since: DateTime<Utc>,
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
    fn event(&self) -> Option<EventKind> {
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
    fn ends_the_graph(&self) -> bool {
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
    fn leaves_running(&self) -> bool {
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
    fn assignments(&self) -> String {
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
                    super::signals::TAKE_SIGNAL
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
                    super::signals::TAKE_SIGNAL
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
                ]),
                Some(super::children::FORGET_DEAD.to_owned()),
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
        super::signals::PENDING_ONE_OF_7,
        super::children::FINISHED_ONE_OF_8,
        super::step_requests::REPLIED_ONE_OF_10
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

/// What a fenced write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The lease is lost or the change was already written: zero rows
    /// matched and nothing was written.
    Lost,
    /// Written as asked, with its event.
    Done,
    /// A transition out of RUNNING found a cancel asked of the job while
    /// its segment ran, and wrote CANCELLED instead (the reason asked as
    /// its error, one CANCELLED event; a last checkpoint it carried is
    /// kept, requests it would have sent are not).
    Cancelled,
}

impl Written {
    /// Whether something was written.
    #[must_use]
    pub fn is_written(self) -> bool {
        !matches!(self, Self::Lost)
    }
}

/// The stamp of a written row, and whether it landed CANCELLED.
#[derive(sqlx::FromRow)]
struct Landed {
    #[sqlx(flatten)]
    stamp: EventStamp,
    status: crate::RunStatus,
    error: Option<String>,
}

/// Applies `change` if `fence` still holds the lease on `job_id` (and, for
/// a commit point, the row is still at the fence's sequence), with its
/// outbox row in the same transaction. A change that takes the job out of
/// RUNNING writes CANCELLED instead when a cancel was asked meanwhile
/// ([`Written::Cancelled`]).
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn transition(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    fence: Fence,
    now: DateTime<Utc>,
    change: &Transition,
) -> Result<Written, StoreError> {
    // A hand-back after an ambiguous commit must match whatever the
    // sequence became: only commit points compare it. Events others wrote
    // meanwhile (signals received) are not the holder's and do not count.
    let sequence = if change.is_commit_point() {
        " AND event_sequence - foreign_events - revision = $4"
    } else {
        ""
    };
    let revision = if change.ends_the_graph() {
        format!(" AND revision = {}", fence.revision)
    } else {
        String::new()
    };
    let update = format!(
        "UPDATE workflow_run SET {}, updated_at = $3
         WHERE job_id = $1 AND lease_token = $2 AND status = 'RUNNING'{sequence}{revision}",
        change.assignments()
    );
    // The event stamp, and the status and error the row landed in.
    let landed = format!("{STAMP}, status, error");
    let sql = match change {
        Transition::Checkpoint { .. } => checkpoint_write(&update, "$5", 0, &landed),
        // The checkpoint row takes the STEP_CHECKPOINT event's sequence,
        // the one before the COMPLETED (or CANCELLED) event's.
        Transition::CheckpointAndComplete { .. } => checkpoint_write(&update, "$5", 1, &landed),
        _ => format!("{update} RETURNING {landed}"),
    };
    let query = crate::sql::query_as(&sql)
        .bind(job_id)
        .bind(fence.token)
        .bind(now)
        .bind(fence.sequence);
    let query = match change {
        Transition::Checkpoint { checkpoint, .. } => query.bind(Json(checkpoint)),
        Transition::Park {
            step,
            timers,
            signals,
            children,
            replies,
            wakes_at,
        } => query
            .bind(step)
            .bind(timers.as_ref().map(Json))
            .bind(signals)
            .bind(children)
            .bind(replies.entries().map(Json))
            .bind(&replies.steps)
            .bind(replies.deadline)
            .bind(*wakes_at),
        Transition::BeginCompensation { failure } => query.bind(Json(failure)),
        Transition::KeepTimers { timers } => query.bind(Json(timers)),
        Transition::Compensated { checkpoint } => query.bind(Json(checkpoint)),
        Transition::Sleep {
            timers, wakes_at, ..
        } => query.bind(Json(timers)).bind(*wakes_at),
        Transition::Complete { result, verdict } => query.bind(Json(result)).bind(verdict),
        Transition::CheckpointAndComplete {
            checkpoint,
            result,
            verdict,
            ..
        } => query
            .bind(Json(checkpoint))
            .bind(Json(result))
            .bind(verdict),
        Transition::Fail { error, verdict } => query.bind(error).bind(verdict),
        Transition::Dead { error } => query.bind(error),
        Transition::Cancel { reason } => query.bind(reason),
        Transition::Requeue { error, run_after } => query.bind(error).bind(*run_after),
        Transition::Release {
            reason,
            run_after,
            since,
        } => query.bind(reason).bind(*run_after).bind(*since),
        Transition::Yield { reason } => query.bind(reason),
        Transition::HandBack {
            reason,
            now,
            backoff,
        } => query
            .bind(reason)
            .bind(*now)
            .bind(i64::try_from(backoff.as_millis()).unwrap_or(i64::MAX)),
    };
    let landed: Option<Landed> = query.fetch_optional(&mut **tx).await?;
    let Some(Landed {
        stamp,
        status,
        error,
    }) = landed
    else {
        return Ok(Written::Lost);
    };
    // Cancelled instead of where the segment meant the job to go.
    let instead = (change.leaves_running() && status == crate::RunStatus::Cancelled).then(|| {
        EventKind::Cancelled {
            reason: error.unwrap_or_default(),
        }
    });
    // The pair's checkpoint takes the sequence before the completion's;
    // both rows go in one statement.
    let checkpointed = match change {
        Transition::CheckpointAndComplete { checkpoint, .. } => Some((
            EventStamp {
                event_sequence: stamp.event_sequence - 1,
                ..stamp.clone()
            },
            EventKind::StepCheckpoint {
                step: checkpoint.name.clone(),
                note: checkpoint.note(),
            },
        )),
        _ => None,
    };
    let mut events = Vec::with_capacity(2);
    if let Some((before, kind)) = &checkpointed {
        events.push((before, kind.clone()));
    }
    let cancelled = instead.is_some();
    // A park that found its answer there already queued the job: no wait
    // to tell of (its statement took no sequence for one).
    let woken = matches!(change, Transition::Park { .. }) && status == crate::RunStatus::Queued;
    if let Some(kind) = instead.or_else(|| change.event()).filter(|_| !woken) {
        events.push((&stamp, kind));
    }
    if !events.is_empty() {
        outbox::insert_many(tx, events, now).await?;
    }
    if cancelled {
        // Its requests are not sent: the job will not wait for them.
        return Ok(Written::Cancelled);
    }
    if let Transition::Park { replies, .. } = change {
        super::step_requests::insert_outgoing(tx, job_id, &replies.sending).await?;
    }
    Ok(Written::Done)
}

/// Locks the rows of `jobs` that no other session holds, in job-id order,
/// and returns those another session holds (an operator's open `SELECT …
/// FOR UPDATE`): the fenced writes to them are not tried in this
/// transaction. A job without a row is not among them (its write finds no
/// row, as a lost lease does).
///
/// # Errors
/// Database errors.
pub async fn held_elsewhere(
    tx: &mut PgTransaction<'_>,
    jobs: &[Uuid],
) -> Result<std::collections::HashSet<Uuid>, sqlx::Error> {
    let locked: Vec<Uuid> = crate::sql::query_scalar(
        "SELECT job_id FROM workflow_run WHERE job_id = ANY($1)
         ORDER BY job_id FOR UPDATE SKIP LOCKED",
    )
    .bind(jobs)
    .fetch_all(&mut **tx)
    .await?;
    let skipped: Vec<Uuid> = jobs
        .iter()
        .filter(|j| !locked.contains(j))
        .copied()
        .collect();
    if skipped.is_empty() {
        return Ok(std::collections::HashSet::new());
    }
    let existing: Vec<Uuid> =
        crate::sql::query_scalar("SELECT job_id FROM workflow_run WHERE job_id = ANY($1)")
            .bind(&skipped)
            .fetch_all(&mut **tx)
            .await?;
    Ok(existing.into_iter().collect())
}

/// What sweeping one lapsed lease did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swept {
    /// Back in the queue, its attempt given back.
    Requeued,
    /// It lost its worker `max_lease_losses` times in a row: DEAD, with its event.
    Dead,
    /// As `Dead`, but its workflow has `on_failure` steps and none have run
    /// yet: queued to run them, headed DEAD (the row's `compensation`, no
    /// event), with a fresh count of lapses. A compensation that loses its
    /// workers as often ends DEAD without a second round.
    Compensating,
    /// A cancellation was asked while it ran and its worker is gone:
    /// CANCELLED with the reason, with its event.
    Cancelled,
}

/// A lapsed lease as the sweep reads it: attempt, lapses in a row, owner,
/// whether the owner is `alive`, `gone` or `unknown`, a cancellation
/// asked of the job, and whether it would compensate before ending (its
/// workflow has `on_failure` steps and no compensation has begun).
#[derive(sqlx::FromRow)]
struct LapsedRow(i32, i32, Option<String>, String, Option<String>, bool);

/// A lapsed lease that was settled: what happened, and during which attempt
/// the lease lapsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweptLease {
    pub outcome: Swept,
    /// The attempt the lost worker was running (given back when requeued).
    pub attempt: i32,
    /// Lapses in a row, this one included if it was counted.
    pub lease_losses: i32,
    /// Whether this lapse counted against the job (its owner was gone).
    pub counted: bool,
}

/// A RUNNING job whose lease lapsed, with what the sweeper's span and
/// counters need before it is settled (its trace, its workflow, its age).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Lapsed {
    pub job_id: Uuid,
    pub workflow_name: String,
    /// The stored workflow's version; `None` for an inline definition.
    pub workflow_version: Option<i32>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// Up to `limit` RUNNING jobs whose lease passed before `now`, oldest first.
///
/// # Errors
/// Database errors.
pub async fn lapsed(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<Lapsed>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT job_id, workflow_name, workflow_version, traceparent, tracestate, created_at FROM workflow_run
         WHERE status = 'RUNNING' AND lease_until < $1
         ORDER BY lease_until LIMIT $2",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// How the sweeper judges a lapsed lease.
#[derive(Debug, Clone, Copy)]
pub struct SweepPolicy {
    /// Lapses in a row, counted only when the owner is gone, that send a job DEAD.
    pub max_lease_losses: i32,
    /// A worker whose `worker_member` row is older than this is gone.
    pub owner_stale_after: std::time::Duration,
    /// How long a lapse waits for a word from an owner whose row is fresh
    /// but who has not announced itself since its lease lapsed (about two
    /// of its announcements).
    pub owner_grace: std::time::Duration,
    /// A lapsed job waits `backoff_base × 2^(losses−1)` before it can be
    /// claimed again (at least one base), so a job that kills its workers
    /// does not take the next one down at once.
    pub backoff_base: std::time::Duration,
}

/// Settles one lapsed lease. A lapse is not a failure of the work: the job
/// goes back to the queue with its attempt given back, after a backoff.
/// Whether the lapse counts against the job depends on its owner:
/// - alive: it announced itself (`worker_member`) after its lease lapsed,
///   so it could not renew for a reason of the world (the database
///   blinked): requeued, not counted;
/// - gone: no row, a row older than `owner_stale_after`, or a worker that
///   started again after it last touched the job: counted;
/// - not known yet: a fresh row, but no announcement since the lapse (it
///   died a moment ago, or it is alive and about to announce): the lease
///   is moved `owner_grace` on and the job is looked at again then.
///
/// The `max_lease_losses`-th counted lapse in a row sends it DEAD (with its
/// event) instead. `None` when the job is not settled now (no longer
/// lapsed, someone else holds its row lock, or its owner is not known yet).
///
/// # Errors
/// Database errors; an event the contract refuses.
pub async fn sweep_one(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    now: DateTime<Utc>,
    policy: SweepPolicy,
) -> Result<Option<SweptLease>, StoreError> {
    let stale_ms = i64::try_from(policy.owner_stale_after.as_millis()).unwrap_or(i64::MAX);
    // Worker clocks agree with the database's to well within a lease
    // (docs/architecture.md), so `lease_until` and `last_seen` compare.
    let lapsed: Option<LapsedRow> = crate::sql::query_as(
        "SELECT r.attempt, r.lease_losses, r.lease_owner,
                CASE WHEN m.worker_id IS NULL OR m.started_at > r.updated_at THEN 'gone'
                     WHEN m.last_seen >= r.lease_until THEN 'alive'
                     WHEN m.last_seen > now() - $3 * interval '1 millisecond' THEN 'unknown'
                     ELSE 'gone' END,
                r.cancel_requested,
                r.compensation IS NULL AND coalesce((
                    SELECT jsonb_typeof(d -> 'on_failure') = 'array' AND d -> 'on_failure' <> '[]'::jsonb
                    FROM coalesce(r.definition, (SELECT w.definition FROM workflow_definition w
                        WHERE w.name = r.workflow_name AND w.version = r.workflow_version)) AS d), false)
         FROM workflow_run r LEFT JOIN worker_member m ON m.worker_id = r.lease_owner
         WHERE r.job_id = $1 AND r.status = 'RUNNING' AND r.lease_until < $2
         FOR UPDATE OF r SKIP LOCKED",
    )
    .bind(job_id)
    .bind(now)
    .bind(stale_ms)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(LapsedRow(attempt, losses, owner, state, cancel_asked, compensable)) = lapsed else {
        return Ok(None);
    };
    if state == "unknown" {
        let wait = chrono::Duration::from_std(policy.owner_grace).unwrap_or(chrono::Duration::MAX);
        crate::sql::query("UPDATE workflow_run SET lease_until = $2 WHERE job_id = $1")
            .bind(job_id)
            .bind(now + wait)
            .execute(&mut **tx)
            .await?;
        return Ok(None);
    }
    let owner_alive = state == "alive";
    if let Some(reason) = cancel_asked {
        // Cancelled as asked: nobody holds the job to do it.
        let stamp: EventStamp = crate::sql::query_as(&format!(
            "UPDATE workflow_run SET status = 'CANCELLED', error = $3, outstanding_step = NULL,
                 event_sequence = event_sequence + 1, lease_owner = NULL, lease_token = NULL,
                 lease_until = NULL, updated_at = $2
             WHERE job_id = $1 RETURNING {STAMP}"
        ))
        .bind(job_id)
        .bind(now)
        .bind(&reason)
        .fetch_one(&mut **tx)
        .await?;
        outbox::insert(tx, &stamp, EventKind::Cancelled { reason }, now).await?;
        return Ok(Some(SweptLease {
            outcome: Swept::Cancelled,
            attempt,
            lease_losses: losses,
            counted: false,
        }));
    }
    let owner = owner.as_deref().unwrap_or("?");
    let losses = if owner_alive { losses } else { losses + 1 };
    let dead = losses >= policy.max_lease_losses;
    let exponent = u32::try_from(losses.clamp(1, 20) - 1).unwrap_or(0);
    let backoff = policy.backoff_base.saturating_mul(1u32 << exponent);
    let run_after = now + chrono::Duration::from_std(backoff).unwrap_or(chrono::Duration::MAX);
    let compensating = dead && compensable;
    let (set, error) = if dead {
        let error = format!(
            "lost its worker {losses} times in a row (the last, {owner}, stopped renewing its lease during attempt {attempt}); \
             a job that stops its worker every time is not tried again"
        );
        let set = if compensating {
            // Headed DEAD as a retryable failure on the last attempt would
            // be (`compensate.rs`), run by the next claim.
            "status = 'QUEUED', run_after = $5, attempt = greatest(attempt - 1, 0), hand_backs = 0,
             compensation = jsonb_build_object('failure', jsonb_build_object(
                 'step', NULL, 'error', $3::text, 'dead', true), 'done', '[]'::jsonb)"
        } else {
            "status = 'DEAD', event_sequence = event_sequence + 1"
        };
        (set, error)
    } else if owner_alive {
        (
            "status = 'QUEUED', run_after = $5, attempt = greatest(attempt - 1, 0)",
            format!(
                "lease expired: worker {owner} is alive but could not renew during attempt {attempt}; \
                 requeued without spending the attempt or counting a lapse"
            ),
        )
    } else {
        (
            "status = 'QUEUED', run_after = $5, attempt = greatest(attempt - 1, 0)",
            format!(
                "lease expired: worker {owner} stopped renewing during attempt {attempt}; \
                 requeued without spending the attempt ({losses} lapse(s) in a row)"
            ),
        )
    };
    let stamp: EventStamp = crate::sql::query_as(&format!(
        "UPDATE workflow_run SET {set}, error = $3, lease_losses = $4, lease_owner = NULL,
             lease_token = NULL, lease_until = NULL, updated_at = $2
         WHERE job_id = $1 RETURNING {STAMP}"
    ))
    .bind(job_id)
    .bind(now)
    .bind(&error)
    .bind(if compensating { 0 } else { losses })
    .bind(run_after)
    .fetch_one(&mut **tx)
    .await?;
    let outcome = if compensating {
        Swept::Compensating
    } else if dead {
        outbox::insert(tx, &stamp, EventKind::Dead { error }, now).await?;
        Swept::Dead
    } else {
        Swept::Requeued
    };
    Ok(Some(SweptLease {
        outcome,
        attempt,
        lease_losses: losses,
        counted: !owner_alive,
    }))
}

/// Hands every `(job, token)` of `leases` still RUNNING under that token
/// back to the queue in one statement: no attempt spent, no lapse counted,
/// no event. A worker at the end of its shutdown grace gives back the jobs
/// it could not finish. Returns how many were handed back.
///
/// # Errors
/// Database errors.
pub async fn hand_back_all(
    conn: &mut PgConnection,
    leases: &[(Uuid, Uuid)],
    now: DateTime<Utc>,
    reason: &str,
) -> Result<u64, sqlx::Error> {
    let (jobs, tokens): (Vec<Uuid>, Vec<Uuid>) = leases.iter().copied().unzip();
    // Rows are locked in job-id order, as group commit locks them, so the
    // two never wait on each other in a cycle.
    let done = crate::sql::query(
        "WITH held AS (
             SELECT r.job_id FROM workflow_run r
             JOIN unnest($1::uuid[], $2::uuid[]) AS h(job_id, token)
               ON r.job_id = h.job_id AND r.lease_token = h.token
             WHERE r.status = 'RUNNING'
             ORDER BY r.job_id
             FOR UPDATE OF r)
         UPDATE workflow_run r SET status = 'QUEUED', error = $4, run_after = $3,
             attempt = greatest(attempt - 1, 0), lease_owner = NULL, lease_token = NULL,
             lease_until = NULL, updated_at = $3
         FROM held WHERE r.job_id = held.job_id",
    )
    .bind(&jobs)
    .bind(&tokens)
    .bind(now)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// Moves a lapsed lease that could not be swept to `until`, behind the
/// others, so one row the sweeper cannot settle never holds the rest back.
///
/// # Errors
/// Database errors.
pub async fn defer_sweep(
    conn: &mut PgConnection,
    job_id: Uuid,
    until: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "UPDATE workflow_run SET lease_until = $2
         WHERE job_id = $1 AND status = 'RUNNING' AND lease_until < $2",
    )
    .bind(job_id)
    .bind(until)
    .execute(conn)
    .await?;
    Ok(())
}
