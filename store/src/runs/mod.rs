//! `workflow_run`: every statement on the run row.
//!
//! A commit point (submission, checkpoint, park, settle) writes the row and
//! its outbox event in one call that takes the caller's transaction, and each
//! bumps `event_sequence` in the same statement, so the event gets the next
//! sequence. Writes to a RUNNING row go through [`lease::transition`],
//! fenced on the lease token.

pub mod children;
pub mod concurrency;
pub mod debounce;
pub mod idle;
pub mod lease;
pub mod moves;
mod read;
pub mod signals;
pub mod step_requests;
pub mod target_slots;
mod write;

pub use read::*;
pub use write::*;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use crate::outbox::EventStamp;
use crate::status::RunStatus;

/// The newest run layout this release reads: 1, runs whose checkpoints are
/// rows of their own or whose definition is their stored version's; 2,
/// runs whose definition is a graph (`needs`, `when`, `parallelism`),
/// which a release before graphs would refuse as a broken definition; 3,
/// runs that wait for signals (`wait_for`), whose row holds `signals` and
/// whose fence leaves out `foreign_events`; 4, runs that start child
/// workflows (`start`), whose rows hold `children`; 5, runs with a step
/// whose target is a pair of Kafka topics, whose rows hold `step_requests`; 6,
/// runs with a `for_each` step, whose item checkpoints may hold the digest
/// of the step's list (`list`), which an earlier release refuses; 7, runs
/// whose definition uses a field of the flow controls (`retry`,
/// `on_timeout`, `execution_timeout_ms`, `debounce`, a bounded wait), whose
/// definitions and checkpoints (`timed_out`) earlier releases refuse; 8,
/// runs of a workflow with a `concurrency` key, which must take a slot of
/// their key before they run (an earlier release would run them past the
/// limit); 9, runs with a step that names its HTTP verb, path, query or
/// headers, that repeats, or that starts a child per item, whose
/// definitions and checkpoints (`call`, `poll`, a child started for an
/// item) earlier releases refuse (and would call the wrong URL). A run
/// states the level it needs in `reader_level`, and a worker claims only
/// runs at or below its own (a later release's runs wait for a worker of
/// that release instead of being run by one that cannot read them).
pub const READER_LEVEL: i16 = 9;
/// Where `timers` keeps the deadline of the wait `step`: apart from the
/// step's own name (a timer's), so an operator's retry can drop every
/// deadline and give each wait its whole `timeout_ms` again.
#[must_use]
pub fn wait_deadline_key(step: &str) -> String {
    format!("{WAIT_DEADLINE_PREFIX}{step}")
}

/// The prefix of a wait's deadline in `timers`.
pub const WAIT_DEADLINE_PREFIX: &str = "deadline:";

/// The level of a run whose definition is a graph.
pub const GRAPH_READER_LEVEL: i16 = 2;
/// The level of a run whose definition waits for signals.
pub const SIGNAL_READER_LEVEL: i16 = 3;
/// The level of a run whose definition starts child workflows.
pub const CHILD_READER_LEVEL: i16 = 4;
/// The level of a run with a step whose target is a pair of Kafka topics.
pub const KAFKA_READER_LEVEL: i16 = 5;
/// The level of a run with a `for_each` step.
pub const FOR_EACH_READER_LEVEL: i16 = 6;
/// The level of a run whose definition uses the flow controls.
pub const CONTROLS_READER_LEVEL: i16 = 7;
/// The level of a run whose workflow has a `concurrency` key.
pub const CONCURRENCY_READER_LEVEL: i16 = 8;
/// The level of a run with a step that names its HTTP verb, path, query
/// or headers, that repeats, or that starts a child per item.
pub const STEP_FORMS_READER_LEVEL: i16 = 9;

/// One executed step: what the row's `checkpoints` array holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub name: String,
    pub skipped: bool,
    pub response: serde_json::Value,
    /// For one item of a `for_each` step: its index (the step's own
    /// checkpoint, the list of answers, comes after every item's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<u32>,
    /// For one page of a paged step: its number (from 0), the response
    /// holding only the `cursor` the next page starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<u32>,
    /// For a `wait_for` step: the number of the signal it took (its
    /// response is that signal's payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i64>,
    /// For a `start` step: the child job it started. This entry does not
    /// end the step (its response is `{"child_job_id": …}`); the step's
    /// own checkpoint, the child's result, comes once the child completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<Uuid>,
    /// For the first item checkpointed of a `for_each` step: the digest of
    /// the step's whole list, which the list of every later segment must
    /// match (the answers are kept by index). Only in runs at
    /// [`FOR_EACH_READER_LEVEL`] or above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<String>,
    /// For a wait (`wait_for`, `start`, external) that ran past its
    /// `timeout_ms`: ended by its `on_timeout` (skipped, or the value it
    /// gives), not by an answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// For a call whose step names its verb, path, query or headers: the
    /// call made, as shown (`GET /orders/42`; never its headers). Only in
    /// runs at [`STEP_FORMS_READER_LEVEL`] or above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    /// For a call of a repeating step whose `until` was false: its number
    /// (from 0). It does not end the step; its response holds only the
    /// calls made so far (`{"calls": n}`), not the answer. Only in runs at
    /// [`STEP_FORMS_READER_LEVEL`] or above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll: Option<u32>,
}

impl Checkpoint {
    /// What its event's verdict says of it when it is not a step's answer.
    #[must_use]
    pub fn note(&self) -> Option<String> {
        if let Some(signal) = self.signal {
            return Some(format!("signal {signal}"));
        }
        if let Some(child) = self.child {
            return Some(format!("child {child} started"));
        }
        if self.timed_out {
            return Some(flotilla_contracts::TIMED_OUT.to_owned());
        }
        if let Some(poll) = self.poll {
            return Some(format!("poll {poll}"));
        }
        match (self.item, self.page, self.skipped) {
            (Some(item), _, _) => Some(format!("item {item}")),
            (None, Some(page), _) => Some(format!("page {page}")),
            (None, None, true) => Some(flotilla_contracts::SKIPPED.to_owned()),
            (None, None, false) => None,
        }
    }
}

/// Where a run's checkpoints start. Appending to the row's array rewrites
/// every earlier response at each step; a row of its own in
/// `workflow_run_checkpoint` is written once. A run that has checkpoint rows
/// keeps adding rows whatever a writer asks, so its array and its rows never
/// interleave: reads give the array, then the rows in event order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointLayout {
    /// Elements of the row's `checkpoints` array (what every release reads).
    Array,
    /// Rows of their own (read only by releases that know the table).
    Rows,
}

impl CheckpointLayout {
    /// The SET clause of a checkpoint write whose entry is the parameter
    /// `entry`; goes with [`checkpoint_write`].
    fn assignment(self, entry: &str) -> String {
        match self {
            Self::Array => format!(
                "checkpoints = CASE WHEN has_checkpoint_rows THEN checkpoints \
                     ELSE checkpoints || jsonb_build_array({entry}::jsonb) END"
            ),
            Self::Rows => {
                "has_checkpoint_rows = true, reader_level = greatest(reader_level, 1)".to_owned()
            }
        }
    }
}

/// One statement that runs `update` (an UPDATE of one run without its
/// RETURNING clause, bumping `event_sequence`) and, if the run keeps its
/// checkpoints as rows, inserts the parameter `entry` as the row of the new
/// sequence less `back` (1 when the checkpoint's event precedes another
/// event of the same write). Returns the columns `returning` (plain names,
/// the event stamp's among them), no row when the update matched none.
fn checkpoint_write(update: &str, entry: &str, back: i64, returning: &str) -> String {
    format!(
        "WITH written AS ({update} RETURNING {returning}, has_checkpoint_rows),
         kept AS (INSERT INTO workflow_run_checkpoint (job_id, event_sequence, entry)
             SELECT job_id, event_sequence - {back}, {entry}::jsonb FROM written WHERE has_checkpoint_rows)
         SELECT {returning} FROM written"
    )
}

/// The whole run row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RunRow {
    pub job_id: Uuid,
    pub workflow_name: String,
    pub workflow_version: Option<i32>,
    pub definition: Json<serde_json::Value>,
    pub input: Json<serde_json::Value>,
    pub request_digest: String,
    pub status: RunStatus,
    pub attempt: i32,
    pub max_attempts: i32,
    /// The caller's labels on the job (a JSON object of strings), if any.
    pub metadata: Option<Json<serde_json::Value>>,
    /// The request's priority (0 to 10): the head start its first
    /// `run_after` was given.
    pub priority: i16,
    /// Each step's failed attempts so far: step name → count.
    pub failed_attempts: Json<serde_json::Value>,
    pub run_after: DateTime<Utc>,
    pub outstanding_step: Option<String>,
    /// Timers set: step name → the instant it wakes at (RFC 3339).
    pub timers: Option<Json<serde_json::Value>>,
    /// Compensation under way: `{failure, done}` (the failure the job ends
    /// with, the `on_failure` steps answered).
    pub compensation: Option<Json<serde_json::Value>>,
    /// The definition's revision: 0 as submitted, one more per graft.
    pub revision: i32,
    /// A cancellation asked while the job ran: the reason.
    pub cancel_requested: Option<String>,
    /// Signals sent to the job, oldest first (see [`signals`]).
    pub signals: Option<Json<serde_json::Value>>,
    /// Events others wrote for the job (signals received), which the lease
    /// holder's fence leaves out.
    pub foreign_events: i32,
    /// The job whose step started this one, and that step.
    pub parent_job_id: Option<Uuid>,
    pub parent_step: Option<String>,
    /// How deep it is in its family: 0 for a job nobody started.
    pub depth: i16,
    /// Whether cancelling the parent cancels it.
    pub cancel_with_parent: bool,
    /// Finished children, by the step that started each (see [`children`]).
    pub children: Option<Json<serde_json::Value>>,
    /// The latest request of each step whose target is a pair of Kafka
    /// topics, with its reply once matched (see [`step_requests`]).
    pub step_requests: Option<Json<serde_json::Value>>,
    /// While WAITING: when the earliest request it waits on times out.
    pub reply_deadline: Option<DateTime<Utc>>,
    /// While WAITING: when the earliest timer it has reached comes due.
    pub wake_at: Option<DateTime<Utc>>,
    /// When the workflow's `execution_timeout_ms` ends the job, if it has one.
    pub expires_at: Option<DateTime<Utc>>,
    /// The workflow's `debounce` key this job's input gave, if it has one.
    pub debounce_key: Option<String>,
    /// The workflow's `concurrency` key this job's input gave, if it has
    /// one, and the most jobs of the key that may hold a slot at once.
    pub concurrency_key: Option<String>,
    pub concurrency_limit: Option<i32>,
    /// Whether the job holds a slot of its concurrency key (from its first
    /// segment until it ends; see [`concurrency`]).
    pub holds_slot: bool,
    /// The row's array followed by the run's checkpoint rows, in order.
    /// Kept as raw JSON: a malformed entry must fail the job loudly, not the load.
    pub checkpoints: Json<serde_json::Value>,
    /// Whether the run keeps its checkpoints (after its array) as rows.
    pub has_checkpoint_rows: bool,
    pub result: Option<Json<serde_json::Value>>,
    pub verdict: Option<String>,
    pub error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    pub lease_token: Option<Uuid>,
    /// Lapsed leases since the job last made progress.
    pub lease_losses: i32,
    /// Hand-backs in a row since the job last made progress.
    pub hand_backs: i32,
    /// Since when only workers lacking one of its targets have claimed it.
    pub unplaced_since: Option<DateTime<Utc>>,
    pub event_sequence: i64,
    /// The newest layout a worker must read to run this job ([`READER_LEVEL`]).
    pub reader_level: i16,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Why the checkpoints could not be read (then `checkpoints` is JSON
    /// `null`): a claim hands the run over all the same, to be failed,
    /// rather than fail the statement that claimed it with others.
    #[sqlx(skip)]
    pub unreadable: Option<String>,
}

impl RunRow {
    /// The stamp for an event at this row's current sequence.
    fn stamp(&self) -> EventStamp {
        EventStamp {
            job_id: self.job_id,
            event_sequence: self.event_sequence,
            workflow_name: self.workflow_name.clone(),
            workflow_version: self.workflow_version,
            metadata: self.metadata.clone(),
            attempt: self.attempt,
            traceparent: self.traceparent.clone(),
            tracestate: self.tracestate.clone(),
        }
    }

    /// The steps that have ended: those with a checkpoint of their own
    /// (an item's, a page's, a poll's or a child start's entry does not end
    /// a step).
    #[must_use]
    pub fn ended_steps(&self) -> std::collections::HashSet<&str> {
        self.checkpoints
            .0
            .as_array()
            .into_iter()
            .flatten()
            .filter(|entry| {
                ["item", "page", "poll", "child"]
                    .iter()
                    .all(|part| entry.get(part).is_none())
            })
            .filter_map(|entry| entry.get("name").and_then(serde_json::Value::as_str))
            .collect()
    }

    /// Whether the checkpoints hold an entry for `step`.
    #[must_use]
    pub fn has_checkpoint(&self, step: &str) -> bool {
        self.checkpoints.0.as_array().is_some_and(|entries| {
            entries
                .iter()
                .any(|e| e.get("name").and_then(|n| n.as_str()) == Some(step))
        })
    }

    /// Whether `step` waited past its `timeout_ms`: ended by its
    /// `on_timeout`, or still unended with its deadline behind `now`.
    #[must_use]
    pub fn wait_timed_out(&self, step: &str, now: DateTime<Utc>) -> bool {
        let ended_so = self.checkpoints.0.as_array().is_some_and(|entries| {
            entries.iter().any(|e| {
                e.get("name").and_then(|n| n.as_str()) == Some(step)
                    && e.get("timed_out") == Some(&serde_json::Value::Bool(true))
            })
        });
        ended_so
            || (!self.has_checkpoint(step) && self.wait_deadline(step).is_some_and(|at| at <= now))
    }

    /// When `step`, a wait with a `timeout_ms`, stops waiting, once the
    /// job has reached it (kept in `timers` under [`wait_deadline_key`]).
    #[must_use]
    pub fn wait_deadline(&self, step: &str) -> Option<DateTime<Utc>> {
        self.timer(&wait_deadline_key(step))
    }

    /// The instant stored for `step` in `timers`: a timer's wake-up, or a
    /// bounded wait's deadline.
    #[must_use]
    pub fn timer(&self, step: &str) -> Option<DateTime<Utc>> {
        let stored = self.timers.as_ref()?.0.get(step)?.as_str()?;
        DateTime::parse_from_rfc3339(stored)
            .ok()
            .map(|at| at.with_timezone(&Utc))
    }
}

/// A run's checkpoints as one list: the row's array, then its checkpoint
/// rows in event order (see [`CheckpointLayout`]). A macro so that it can
/// be spliced into [`COLUMNS`] at compile time.
macro_rules! checkpoint_list {
    () => {
        "CASE WHEN has_checkpoint_rows THEN checkpoints || coalesce((SELECT jsonb_agg(c.entry ORDER BY c.event_sequence) \
            FROM workflow_run_checkpoint c WHERE c.job_id = workflow_run.job_id), '[]'::jsonb) \
            ELSE checkpoints END"
    };
}

/// Every column of the row, the checkpoints as `$list`. `definition` is
/// the row's copy or, for a row that points at its stored version, that
/// version's document; JSON `null` if neither exists (a row another writer
/// broke), which fails the job when it runs rather than the statement that
/// read it. A macro so that the lists below are built at compile time.
macro_rules! columns {
    ($list:expr) => {
        concat!(
            "job_id, workflow_name, workflow_version, \
            coalesce(definition, (SELECT d.definition FROM workflow_definition d \
                WHERE d.name = workflow_name AND d.version = workflow_version), 'null'::jsonb) AS definition, \
            input, request_digest, status, attempt, max_attempts, priority, failed_attempts, run_after, outstanding_step, timers, compensation, revision, cancel_requested, signals, foreign_events, \
            parent_job_id, parent_step, depth, cancel_with_parent, children, step_requests, reply_deadline, wake_at, expires_at, debounce_key, concurrency_key, concurrency_limit, holds_slot, metadata, ",
            $list,
            " AS checkpoints, has_checkpoint_rows, result, verdict, error, lease_owner, \
            lease_until, lease_token, lease_losses, hand_backs, unplaced_since, event_sequence, reader_level, traceparent, tracestate, created_at, updated_at"
        )
    };
}

/// Each checkpoint's outline, in list order: the entry without its
/// `response` (what a signal needs to judge a job's graph: which steps
/// have ended, which wait is ready), so reading it costs the job's step
/// count, not its answers. An entry that is not an object is kept as is.
macro_rules! checkpoint_outline {
    () => {
        "(SELECT coalesce(jsonb_agg(CASE WHEN jsonb_typeof(a.e) = 'object' THEN a.e - 'response' ELSE a.e END \
            ORDER BY a.n), '[]'::jsonb) \
            FROM jsonb_array_elements(CASE WHEN jsonb_typeof(checkpoints) = 'array' THEN checkpoints \
                ELSE '[]'::jsonb END) WITH ORDINALITY AS a(e, n)) \
         || CASE WHEN has_checkpoint_rows THEN coalesce((SELECT jsonb_agg(CASE WHEN jsonb_typeof(c.entry) = 'object' \
            THEN c.entry - 'response' ELSE c.entry END ORDER BY c.event_sequence) \
            FROM workflow_run_checkpoint c WHERE c.job_id = workflow_run.job_id), '[]'::jsonb) \
            ELSE '[]'::jsonb END"
    };
}

/// Every column of the row, `checkpoints` their outlines
/// ([`checkpoint_outline`]).
const OUTLINE_COLUMNS: &str = columns!(checkpoint_outline!());

/// Every column of the row, `checkpoints` the whole list
/// ([`checkpoint_list`]); a statement that locks a row after another
/// transaction changed it must read them again
/// ([`reread_checkpoint_rows`]).
const COLUMNS: &str = columns!(checkpoint_list!());

/// Every column of the row, `checkpoints` only the row's array: for a
/// statement that reads the checkpoint rows again in any case
/// ([`reread_checkpoint_rows`]), and must not fail with the one run whose
/// list cannot be built.
const COLUMNS_BUT_CHECKPOINT_ROWS: &str = columns!("checkpoints");

/// Reads again, in a statement of its own, the checkpoints of those `rows`
/// that keep them as rows. At READ COMMITTED a statement that locks a row
/// changed since it began (after waiting for its lock, or claiming it
/// after another worker ran and requeued it) returns the row as it is now,
/// but its subqueries still read the snapshot the statement began with:
/// checkpoint rows committed meanwhile would be missing from the list. The
/// caller holds the lock or the lease, so nothing is added after this read.
async fn reread_checkpoint_rows(
    conn: &mut PgConnection,
    rows: &mut [RunRow],
) -> Result<(), sqlx::Error> {
    let ids: Vec<Uuid> = rows
        .iter()
        .filter(|row| row.has_checkpoint_rows)
        .map(|row| row.job_id)
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let mut lists: std::collections::HashMap<Uuid, Result<_, String>> =
        match read_checkpoint_lists(conn, &ids).await {
            Ok(lists) => lists.into_iter().map(|(id, list)| (id, Ok(list))).collect(),
            Err(e) if is_beyond_jsonb_limits(&e) => {
                // A run's list is past what a jsonb value holds: each is
                // read alone, so only that run learns it.
                let mut lists = std::collections::HashMap::new();
                for id in ids {
                    match read_checkpoint_lists(conn, &[id]).await {
                        Ok(list) => lists.extend(list.into_iter().map(|(id, l)| (id, Ok(l)))),
                        Err(e) if is_beyond_jsonb_limits(&e) => {
                            lists.insert(id, Err(e.to_string()));
                        }
                        Err(e) => return Err(e),
                    }
                }
                lists
            }
            Err(e) => return Err(e),
        };
    for row in rows {
        match lists.remove(&row.job_id) {
            Some(Ok(list)) => row.checkpoints = list,
            Some(Err(e)) => {
                row.checkpoints = Json(serde_json::Value::Null);
                row.unreadable = Some(format!("its stored checkpoints cannot be read: {e}"));
            }
            None => {}
        }
    }
    Ok(())
}

/// The whole checkpoint list of each run of `ids`.
async fn read_checkpoint_lists(
    conn: &mut PgConnection,
    ids: &[Uuid],
) -> Result<Vec<(Uuid, Json<serde_json::Value>)>, sqlx::Error> {
    crate::sql::query_as(concat!(
        "SELECT job_id, ",
        checkpoint_list!(),
        " FROM workflow_run WHERE job_id = ANY($1)"
    ))
    .bind(ids)
    .fetch_all(conn)
    .await
}

/// Whether Postgres refused to build a value past its limits
/// (`program_limit_exceeded`: a jsonb array past 256 MB, among others):
/// an error about the run read, not about the database.
fn is_beyond_jsonb_limits(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == "54000")
}

/// The columns an event repeats, returned by every commit-point statement.
const STAMP: &str = "job_id, event_sequence, workflow_name, workflow_version, metadata, attempt, traceparent, tracestate";
