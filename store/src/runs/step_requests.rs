//! Steps whose target is a pair of Kafka topics, on the run row: each such
//! step's latest request (`step_requests`: correlation id, the attempt
//! that sent it, topics, deadline) and the reply matched to it; the
//! deadline a WAITING job's requests run out at (`reply_deadline`); and the
//! request outbox row written with the park that sends it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use sqlx::{PgPool, PgTransaction};
use uuid::Uuid;

use super::RunRow;
use crate::RunStatus;

/// A step's latest request, as the row keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestEntry {
    pub correlation_id: Uuid,
    /// The row's attempt that sent it: a later attempt sends a new one.
    pub attempt: i32,
    pub topic: String,
    pub reply_topic: String,
    pub deadline: DateTime<Utc>,
    /// When the park that sends it was built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<DateTime<Utc>>,
    /// The reply matched to it, once one came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<StoredReply>,
}

/// A reply as the row keeps it: an answer, or an error and whether
/// trying again may help.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredReply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub retryable: bool,
    pub received_at: DateTime<Utc>,
}

/// The latest request of `step`, if it ever sent one.
///
/// # Errors
/// The row's `step_requests` do not read (a row another writer broke).
pub fn entry_of(row: &RunRow, step: &str) -> Result<Option<RequestEntry>, String> {
    let Some(requests) = &row.step_requests else {
        return Ok(None);
    };
    requests
        .0
        .get(step)
        .map(|entry| serde_json::from_value(entry.clone()))
        .transpose()
        .map_err(|e| format!("the request of step {step} does not read: {e}"))
}

/// A request to send, written with the park that waits for its reply.
#[derive(Debug, Clone, PartialEq)]
pub struct OutgoingRequest {
    pub step: String,
    pub entry: RequestEntry,
    /// `avro` (through the registry) or `json`.
    pub encoding: &'static str,
    /// The record's value as the contract's JSON form.
    pub payload: serde_json::Value,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// What a park that sends or waits for requests adds to the row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AwaitedReplies {
    /// Requests sent by this park.
    pub sending: Vec<OutgoingRequest>,
    /// Every step whose reply the job waits for (those sent now included):
    /// a reply already matched to one of them requeues the job at once.
    pub steps: Vec<String>,
    /// The earliest deadline among them.
    pub deadline: Option<DateTime<Utc>>,
}

impl AwaitedReplies {
    /// The new entries, by step, as one JSON object (`None`: none).
    pub(super) fn entries(&self) -> Option<serde_json::Value> {
        if self.sending.is_empty() {
            return None;
        }
        let map: serde_json::Map<String, serde_json::Value> = self
            .sending
            .iter()
            .map(|request| {
                (
                    request.step.clone(),
                    serde_json::to_value(&request.entry).unwrap_or_default(),
                )
            })
            .collect();
        Some(serde_json::Value::Object(map))
    }
}

/// Part of a park's wake condition: a reply was matched meanwhile to the
/// request of one of the steps in the text array `$10` (not to an earlier
/// request of a step this park sends anew, in `$9`).
pub(super) const REPLIED_ONE_OF_10: &str = "coalesce((SELECT bool_or((step_requests -> s) ? 'reply' \
         AND NOT coalesce($9::jsonb ? s, false)) \
     FROM unnest($10::text[]) AS s), false)";

/// Writes the requests of a park to the request outbox, in its transaction.
///
/// # Errors
/// Database errors.
pub(super) async fn insert_outgoing(
    tx: &mut PgTransaction<'_>,
    job_id: Uuid,
    requests: &[OutgoingRequest],
) -> Result<(), sqlx::Error> {
    for request in requests {
        crate::sql::query(
            "INSERT INTO workflow_step_request_outbox
                 (job_id, step_name, correlation_id, topic, encoding, payload, traceparent, tracestate)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(job_id)
        .bind(&request.step)
        .bind(request.entry.correlation_id)
        .bind(&request.entry.topic)
        .bind(request.encoding)
        .bind(Json(&request.payload))
        .bind(&request.traceparent)
        .bind(&request.tracestate)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// A reply as read, to be matched.
#[derive(Debug, Clone, Copy)]
pub struct IncomingReply<'a> {
    pub job_id: Uuid,
    pub correlation_id: Uuid,
    /// The topic it was read on: only its request's reply topic is taken.
    pub topic: &'a str,
    pub reply: &'a StoredReply,
}

/// What became of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyMatch {
    /// Kept on its step's request; `woken`: the job was WAITING and is
    /// queued again to take it; `waited`: since the request was made.
    Recorded {
        step: String,
        woken: bool,
        waited: Option<chrono::TimeDelta>,
    },
    /// Its request was answered before: nothing changed.
    Repeat { step: String },
    /// No request of the job has this correlation id now (an earlier
    /// attempt's, timed out or answered and retried, or never sent).
    Stale,
    /// It came on another topic than its request's reply topic (a
    /// principal that may write there but not to the target's own reply
    /// topic): nothing changed.
    WrongTopic { step: String, expected: String },
    /// It came at or after its request's deadline: the step has timed
    /// out, or will without it; nothing changed.
    Late { step: String },
    /// The job has ended.
    Finished(RunStatus),
    /// No such job.
    UnknownJob,
}

/// Matches `incoming` to the request of its job with its correlation id
/// and keeps it there, under the row lock, waited for at most
/// `lock_wait` (a row another session holds fails the match with
/// `lock_not_available`, to be tried again, rather than hold up the
/// caller); a WAITING job goes back to the queue at once (its attempt
/// given back, as for any wake from a park). A RUNNING job's lease holder
/// is not disturbed: its next park finds the reply and requeues instead
/// of waiting. A reply on another topic than its request's reply topic,
/// or past its deadline, changes nothing.
///
/// # Errors
/// Database errors.
pub async fn record_reply(
    pool: &PgPool,
    incoming: IncomingReply<'_>,
    lock_wait: std::time::Duration,
) -> Result<ReplyMatch, sqlx::Error> {
    let IncomingReply {
        job_id,
        correlation_id,
        topic,
        reply,
    } = incoming;
    let mut tx = pool.begin().await?;
    crate::sql::bound_lock_wait(&mut tx, lock_wait).await?;
    let found: Option<(RunStatus, Option<Json<serde_json::Value>>)> = crate::sql::query_as(
        "SELECT status, step_requests FROM workflow_run WHERE job_id = $1 FOR UPDATE",
    )
    .bind(job_id)
    .fetch_optional(&mut *tx)
    .await?;
    // Every way out ends the transaction before returning: a transaction
    // merely dropped is rolled back only when its connection is next used,
    // and until then it keeps the row locked against claims (SKIP LOCKED
    // would pass the job by).
    let Some((status, requests)) = found else {
        tx.rollback().await?;
        return Ok(ReplyMatch::UnknownJob);
    };
    let matched = requests.and_then(|Json(requests)| {
        requests.as_object().and_then(|steps| {
            steps.iter().find_map(|(step, entry)| {
                let entry: RequestEntry = serde_json::from_value(entry.clone()).ok()?;
                (entry.correlation_id == correlation_id).then(|| (step.clone(), entry))
            })
        })
    });
    let Some((step, entry)) = matched else {
        tx.rollback().await?;
        return Ok(ReplyMatch::Stale);
    };
    let refused = if entry.reply_topic != topic {
        Some(ReplyMatch::WrongTopic {
            step: step.clone(),
            expected: entry.reply_topic.clone(),
        })
    } else if entry.reply.is_some() {
        Some(ReplyMatch::Repeat { step: step.clone() })
    } else if status.is_finished() {
        Some(ReplyMatch::Finished(status))
    } else if reply.received_at >= entry.deadline {
        // The step fails as timed out at its deadline (`state_of`): a
        // reply from then on would wake a job that waits for something
        // else, or answer a step that has failed.
        Some(ReplyMatch::Late { step: step.clone() })
    } else {
        None
    };
    if let Some(refused) = refused {
        tx.rollback().await?;
        return Ok(refused);
    }
    let woken: bool = crate::sql::query_scalar(
        "UPDATE workflow_run SET
             step_requests = jsonb_set(step_requests, ARRAY[$2::text, 'reply'], $3::jsonb),
             status = CASE WHEN status = 'WAITING' THEN 'QUEUED' ELSE status END,
             outstanding_step = CASE WHEN status = 'WAITING' THEN NULL ELSE outstanding_step END,
             run_after = CASE WHEN status = 'WAITING' THEN $4 ELSE run_after END,
             attempt = CASE WHEN status = 'WAITING' THEN greatest(attempt - 1, 0) ELSE attempt END,
             reply_deadline = CASE WHEN status = 'WAITING' THEN NULL ELSE reply_deadline END
         WHERE job_id = $1
         RETURNING status = 'QUEUED'",
    )
    .bind(job_id)
    .bind(&step)
    .bind(Json(reply))
    .bind(reply.received_at)
    .fetch_one(&mut *tx)
    .await?;
    // Answered: the request no longer holds a slot of a capped target.
    super::target_slots::release_in(&mut tx, job_id, &step, correlation_id).await?;
    tx.commit().await?;
    Ok(ReplyMatch::Recorded {
        step,
        woken: woken && status == RunStatus::Waiting,
        waited: entry.requested_at.map(|at| reply.received_at - at),
    })
}

/// When the earliest request still waiting for its reply was made, over
/// every job that has not finished (`None`: none waits). An entry that
/// does not say when (an earlier release's) counts from its job's
/// creation; one that does not read is passed over.
///
/// # Errors
/// Database errors.
pub async fn earliest_awaited(pool: &PgPool) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    use futures_util::TryStreamExt as _;
    crate::sql::session(pool, async |conn| {
        let mut entries = crate::sql::query_as::<(Option<String>, DateTime<Utc>)>(
            "SELECT e.value ->> 'requested_at', r.created_at
             FROM workflow_run r, LATERAL jsonb_each(CASE WHEN jsonb_typeof(r.step_requests) = 'object'
                                                         THEN r.step_requests ELSE '{}'::jsonb END) e
             WHERE r.status IN ('QUEUED', 'RUNNING', 'WAITING') AND r.step_requests IS NOT NULL
               AND e.value -> 'reply' IS NULL",
        )
        .fetch(conn);
        let mut earliest: Option<DateTime<Utc>> = None;
        while let Some((requested_at, created_at)) = entries.try_next().await? {
            let at = match requested_at {
                Some(text) => match DateTime::parse_from_rfc3339(&text) {
                    Ok(at) => at.with_timezone(&Utc),
                    Err(_) => continue,
                },
                None => created_at,
            };
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
        }
        Ok(earliest)
    })
    .await
}
