//! `workflow_run_outbox`: one row per commit point of a job, written in the
//! same transaction as the run row's change. A row holds the finished event
//! (its JSON form, without what the row's columns hold: [`stored`]) and its
//! trace context, so the relay never reads the run.
//! Rows are written by the commit points of [`crate::runs`]; what the relay
//! does with them is in [`relay`].

use chrono::{DateTime, Utc};
use flotilla_contracts::{EventHeader, WorkflowRunEvent};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use crate::StoreError;

pub mod history;
pub mod relay;
pub mod step_requests;
pub mod stored;

pub use relay::PendingEvent;

/// What a commit point says happened.
#[derive(Debug, Clone)]
pub enum EventKind {
    Accepted,
    /// Steps grafted onto the job, making `revision`.
    Grafted {
        revision: i32,
        steps: Vec<String>,
    },
    /// A signal was received (numbered `seq` in the job).
    SignalReceived {
        name: String,
        seq: i64,
    },
    StepCheckpoint {
        step: String,
        /// What kind of checkpoint, when not a step's answer: `skipped`,
        /// `item <n>`, `page <n>`, `compensation`, `signal <n>` (the event's verdict).
        note: Option<String>,
    },
    Waiting {
        step: String,
    },
    /// Waiting on a timer: WAITING, its verdict saying until when.
    Sleeping {
        step: String,
        until: chrono::DateTime<chrono::Utc>,
    },
    Completed {
        verdict: String,
        result: serde_json::Value,
    },
    Failed {
        error: String,
        verdict: Option<String>,
    },
    Dead {
        error: String,
    },
    Cancelled {
        reason: String,
    },
}

/// Where an event sits: the job, its freshly allocated sequence, and the
/// run's fields the event repeats.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventStamp {
    pub job_id: Uuid,
    pub event_sequence: i64,
    pub workflow_name: String,
    /// `None` for a job that keeps its own copy of the definition.
    pub workflow_version: Option<i32>,
    /// The job's metadata, echoed on each of its events.
    pub metadata: Option<Json<serde_json::Value>>,
    pub attempt: i32,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// Builds the event through the contract's constructors (which enforce the
/// message rules) and inserts its outbox row.
///
/// # Errors
/// The event breaks a rule (a bug: nothing is written), or the database fails.
pub async fn insert(
    conn: &mut PgConnection,
    stamp: &EventStamp,
    kind: EventKind,
    now: DateTime<Utc>,
) -> Result<WorkflowRunEvent, StoreError> {
    let mut events = insert_many(conn, vec![(stamp, kind)], now).await?;
    Ok(events.remove(0))
}

/// Builds many events and inserts their outbox rows in one statement.
///
/// # Errors
/// An event breaks a rule (a bug: nothing is written), or the database fails.
pub async fn insert_many(
    conn: &mut PgConnection,
    commits: Vec<(&EventStamp, EventKind)>,
    now: DateTime<Utc>,
) -> Result<Vec<WorkflowRunEvent>, StoreError> {
    let events = commits
        .into_iter()
        .map(|(stamp, kind)| build(stamp, kind, now).map(|event| (event, stamp)))
        .collect::<Result<Vec<_>, _>>()?;
    let column = |f: fn(&(WorkflowRunEvent, &EventStamp)) -> Option<String>| {
        events.iter().map(f).collect::<Vec<_>>()
    };
    let bodies = events
        .iter()
        .map(|(event, _)| stored::compact(event).map(Json))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    crate::sql::query(
        "INSERT INTO workflow_run_outbox (event_id, job_id, sequence, event_type, body, traceparent, tracestate, created_at)
         SELECT event_id, job_id, sequence, event_type, body, traceparent, tracestate, $8
         FROM UNNEST($1::uuid[], $2::uuid[], $3::int8[], $4::text[], $5::jsonb[], $6::text[], $7::text[])
             AS e(event_id, job_id, sequence, event_type, body, traceparent, tracestate)",
    )
    .bind(events.iter().map(|(e, _)| e.event_id()).collect::<Vec<_>>())
    .bind(events.iter().map(|(e, _)| e.job_id()).collect::<Vec<_>>())
    .bind(events.iter().map(|(e, _)| e.sequence()).collect::<Vec<_>>())
    .bind(column(|(e, _)| Some(e.event_type().as_str().to_owned())))
    .bind(bodies)
    .bind(column(|(_, stamp)| stamp.traceparent.clone()))
    .bind(column(|(_, stamp)| stamp.tracestate.clone()))
    .bind(now)
    .execute(conn)
    .await?;
    Ok(events.into_iter().map(|(event, _)| event).collect())
}

/// The event of a commit point, through the contract's constructors.
fn build(
    stamp: &EventStamp,
    kind: EventKind,
    now: DateTime<Utc>,
) -> Result<WorkflowRunEvent, StoreError> {
    let header = EventHeader {
        event_id: Uuid::new_v4(),
        job_id: stamp.job_id,
        sequence: stamp.event_sequence,
        workflow_name: stamp.workflow_name.clone(),
        attempt: stamp.attempt,
        occurred_at: now,
    };
    let event = match kind {
        EventKind::Accepted => WorkflowRunEvent::accepted(header),
        EventKind::Grafted { revision, steps } => {
            WorkflowRunEvent::grafted(header, revision, &steps)
        }
        EventKind::SignalReceived { name, seq } => {
            WorkflowRunEvent::signal_received(header, &name, seq)
        }
        EventKind::StepCheckpoint { step, note } => {
            WorkflowRunEvent::step_checkpoint(header, step, note)
        }
        EventKind::Waiting { step } => WorkflowRunEvent::waiting(header, step),
        EventKind::Sleeping { step, until } => WorkflowRunEvent::sleeping(header, step, until),
        EventKind::Completed { verdict, result } => {
            WorkflowRunEvent::completed(header, verdict, result)
        }
        EventKind::Failed { error, verdict } => WorkflowRunEvent::failed(header, error, verdict),
        EventKind::Dead { error } => WorkflowRunEvent::dead(header, error),
        EventKind::Cancelled { reason } => WorkflowRunEvent::cancelled(header, reason),
    }?;
    // What the row repeats on its events came through the contract's rules
    // when it was written; a row another writer broke (labels that are no
    // map of strings or past their bounds, a version below 1) gives its
    // events none of it, rather than failing the commit point.
    let metadata = stamp
        .metadata
        .as_ref()
        .and_then(|m| serde_json::from_value::<flotilla_contracts::Metadata>(m.0.clone()).ok())
        .filter(|m| flotilla_contracts::metadata::check(m).is_ok());
    let version = stamp.workflow_version.filter(|v| *v >= 1);
    Ok(event
        .with_workflow_version(version)?
        .with_metadata(metadata)?)
}

/// A job's events in sequence order (for tests and the API's debugging views).
///
/// # Errors
/// Database errors, or a stored event that does not decode.
pub async fn events_of(
    conn: &mut PgConnection,
    job_id: Uuid,
) -> Result<Vec<WorkflowRunEvent>, sqlx::Error> {
    type Row = (Uuid, i64, String, Option<String>, Option<String>);
    let rows: Vec<Row> = crate::sql::query_as(
        "SELECT event_id, sequence, event_type, payload::text, body::text
         FROM workflow_run_outbox WHERE job_id = $1 ORDER BY sequence",
    )
    .bind(job_id)
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|(event_id, sequence, event_type, payload, body)| {
            let columns = stored::Columns {
                event_id,
                job_id,
                sequence,
                event_type: &event_type,
            };
            stored::event(payload.as_deref(), body.as_deref(), columns)
                .map_err(|e| sqlx::Error::Decode(Box::new(e)))
        })
        .collect()
}

/// Rows no bucket's progress covers yet, and when the oldest was written:
/// per bucket, a range of the `(bucket, txid, id)` index from its
/// progress's xmin (the published history behind it is not read).
pub const UNPUBLISHED: &str = "SELECT count(*) AS pending, min(o.created_at) AS oldest
     FROM relay_bucket b
     CROSS JOIN LATERAL (
         SELECT o.created_at FROM workflow_run_outbox o
         WHERE o.bucket = b.bucket AND o.txid >= pg_snapshot_xmin(b.published)
           AND NOT pg_visible_in_snapshot(o.txid, b.published)) o";

/// The relay's backlog: rows not published yet and the age in seconds of
/// the oldest (0 when none). Read per scrape ([`UNPUBLISHED`]).
///
/// # Errors
/// Database errors.
pub async fn backlog(pool: &sqlx::PgPool) -> Result<(i64, f64), sqlx::Error> {
    crate::sql::session(pool, async |conn| {
        let mut tx = sqlx::Connection::begin(conn).await?;
        relay::prefer_indexes(&mut tx).await?;
        let backlog = crate::sql::query_as(&format!(
            "SELECT pending, coalesce(extract(epoch FROM now() - oldest)::float8, 0) FROM ({UNPUBLISHED}) u"
        ))
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(backlog)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row whose stored labels or version break the contract still gets
    /// its event, without them.
    #[test]
    fn a_rows_broken_labels_or_version_are_left_off_its_event_not_fatal_to_it() {
        let many: serde_json::Map<String, serde_json::Value> = (0..17)
            .map(|n| (format!("k{n}"), serde_json::json!("v")))
            .collect();
        for (metadata, version) in [
            (serde_json::Value::Object(many), Some(2)),
            (serde_json::json!({"two words": "x"}), Some(2)),
            (serde_json::json!({"k": 7}), Some(2)),
            (serde_json::json!({"k": "v"}), Some(0)),
        ] {
            let stamp = EventStamp {
                job_id: Uuid::new_v4(),
                event_sequence: 1,
                workflow_name: "w".into(),
                workflow_version: version,
                metadata: Some(Json(metadata.clone())),
                attempt: 0,
                traceparent: None,
                tracestate: None,
            };
            let event = build(&stamp, EventKind::Accepted, Utc::now())
                .unwrap_or_else(|e| panic!("{metadata} {version:?}: {e}"));
            let kept_labels = event.metadata().is_some();
            assert_eq!(
                kept_labels,
                metadata == serde_json::json!({"k": "v"}),
                "{metadata}"
            );
            assert_eq!(event.workflow_version(), version.filter(|v| *v >= 1));
        }
    }
}
