//! How an event is kept in its outbox row. Written compact, as `body`: the
//! event's JSON without what the row's columns already hold (`event_id`,
//! `job_id`, `sequence`, `type`) and without absent fields, about 200
//! bytes of WAL and heap less per event. Rows of earlier writers hold the
//! whole event in `payload`. Readers take both (migration
//! `20261207000001_compact_events.sql`).

use flotilla_contracts::{DecodeError, Message, WorkflowRunEvent, json};
use serde_json::{Map, Value};
use uuid::Uuid;

/// The fields of an event its row's columns hold.
const IN_COLUMNS: [&str; 4] = ["event_id", "job_id", "sequence", "type"];

/// The event as its row's `body` keeps it.
///
/// # Errors
/// The event does not serialize (a bug).
pub fn compact(event: &WorkflowRunEvent) -> Result<Value, serde_json::Error> {
    let mut document = serde_json::to_value(event)?;
    if let Some(fields) = document.as_object_mut() {
        // A null field reads back as absent: the event is the same.
        fields.retain(|name, value| !IN_COLUMNS.contains(&name.as_str()) && !value.is_null());
    }
    Ok(document)
}

/// The columns a compact body is read back with.
#[derive(Debug, Clone, Copy)]
pub struct Columns<'a> {
    pub event_id: Uuid,
    pub job_id: Uuid,
    pub sequence: i64,
    pub event_type: &'a str,
}

impl Columns<'_> {
    /// Puts the columns' fields back into `body`, over what it may hold.
    fn restore(&self, body: &mut Map<String, Value>) {
        body.insert("event_id".into(), Value::String(self.event_id.to_string()));
        body.insert("job_id".into(), Value::String(self.job_id.to_string()));
        body.insert("sequence".into(), Value::from(self.sequence));
        body.insert("type".into(), Value::String(self.event_type.to_owned()));
    }
}

/// The event of a row: its `payload` (the whole event, from an earlier
/// writer) if it has one, else its compact `body` with the columns put
/// back. Either way decoded and checked as the contract's message.
///
/// # Errors
/// The stored document does not decode, or the row has neither form.
pub fn event(
    payload: Option<&str>,
    body: Option<&str>,
    columns: Columns<'_>,
) -> Result<WorkflowRunEvent, DecodeError> {
    if let Some(payload) = payload {
        return json::decode_stored_text(payload);
    }
    let mismatch = |reason: String| DecodeError::JsonMismatch {
        schema: WorkflowRunEvent::AVRO_NAME,
        reason,
    };
    let body = body.ok_or_else(|| mismatch("the row holds no event".into()))?;
    let mut document: Value = serde_json::from_str(body).map_err(|e| mismatch(e.to_string()))?;
    let fields = document
        .as_object_mut()
        .ok_or_else(|| mismatch("the stored event is not an object".into()))?;
    columns.restore(fields);
    json::decode_stored(document)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use flotilla_contracts::EventHeader;

    fn header(sequence: i64) -> EventHeader {
        EventHeader {
            event_id: Uuid::new_v4(),
            job_id: Uuid::new_v4(),
            sequence,
            workflow_name: "shipping".into(),
            attempt: 2,
            occurred_at: chrono::Utc.timestamp_micros(1_764_900_000_123_456).unwrap(),
        }
    }

    fn columns(event: &WorkflowRunEvent) -> (Uuid, Uuid, i64, String) {
        (
            event.event_id(),
            event.job_id(),
            event.sequence(),
            event.event_type().as_str().to_owned(),
        )
    }

    fn round_trip(event: &WorkflowRunEvent) -> WorkflowRunEvent {
        let body = compact(event).unwrap().to_string();
        let (event_id, job_id, sequence, event_type) = columns(event);
        let read = Columns {
            event_id,
            job_id,
            sequence,
            event_type: &event_type,
        };
        super::event(None, Some(&body), read).unwrap()
    }

    #[test]
    fn every_kind_of_event_reads_back_the_same_from_its_compact_body() {
        let events = [
            WorkflowRunEvent::accepted(header(1)).unwrap(),
            WorkflowRunEvent::step_checkpoint(header(2), "pack", None).unwrap(),
            WorkflowRunEvent::completed(
                header(3),
                "completed 1 steps",
                serde_json::json!({"a": null, "b": [1, null]}),
            )
            .unwrap(),
            WorkflowRunEvent::failed(header(4), "it broke", Some("refused".into())).unwrap(),
        ];
        for event in &events {
            assert_eq!(&round_trip(event), event);
        }
    }

    #[test]
    fn a_compact_body_leaves_out_the_columns_and_the_absent_fields_only() {
        let event = WorkflowRunEvent::step_checkpoint(header(2), "pack", None).unwrap();
        let body = compact(&event).unwrap();
        let mut names: Vec<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["attempt", "occurred_at", "step_name", "workflow_name"]
        );
        let whole = serde_json::to_string(&event).unwrap();
        assert!(
            body.to_string().len() * 2 < whole.len(),
            "{body} against {whole}"
        );
    }

    #[test]
    fn a_whole_payload_wins_and_a_row_with_neither_form_or_a_broken_body_does_not_decode() {
        let event = WorkflowRunEvent::accepted(header(1)).unwrap();
        let whole = serde_json::to_string(&event).unwrap();
        let (event_id, job_id, sequence, event_type) = columns(&event);
        let read = Columns {
            event_id,
            job_id,
            sequence,
            event_type: &event_type,
        };
        assert_eq!(super::event(Some(&whole), None, read).unwrap(), event);
        assert!(super::event(None, None, read).is_err());
        assert!(super::event(None, Some("[1, 2]"), read).is_err());
        assert!(super::event(None, Some("{not json"), read).is_err());
        // A body without the fields of its own is refused by the contract.
        assert!(super::event(None, Some("{}"), read).is_err());
    }
}
