//! Every message rule is enforced by the constructors and again on decode,
//! with an error that names the rule.

mod support;

use flotilla_contracts::avro::{self, AvroMessage};
use flotilla_contracts::{DecodeError, RuleViolation, WorkflowRunEvent, WorkflowRunRequest, json};
use serde_json::{Value, json};
use support::header;
use uuid::Uuid;

#[test]
fn completed_needs_a_non_empty_verdict() {
    for verdict in ["", "  "] {
        let err = WorkflowRunEvent::completed(header(1), verdict, json!({})).unwrap_err();
        assert_eq!(err, RuleViolation::CompletedWithoutVerdict);
        assert!(
            err.to_string()
                .contains("COMPLETED event carries a non-empty verdict")
        );
    }
}

#[test]
fn failed_dead_and_cancelled_need_the_error() {
    let cases: [(&str, Result<WorkflowRunEvent, RuleViolation>); 3] = [
        ("FAILED", WorkflowRunEvent::failed(header(1), "", None)),
        ("DEAD", WorkflowRunEvent::dead(header(1), " ")),
        ("CANCELLED", WorkflowRunEvent::cancelled(header(1), "")),
    ];
    for (event_type, result) in cases {
        assert_eq!(
            result.unwrap_err(),
            RuleViolation::TerminalWithoutError { event_type }
        );
    }
}

#[test]
fn checkpoint_and_waiting_events_name_their_step() {
    assert_eq!(
        WorkflowRunEvent::step_checkpoint(header(1), "", None).unwrap_err(),
        RuleViolation::StepEventWithoutStep {
            event_type: "STEP_CHECKPOINT"
        }
    );
    assert_eq!(
        WorkflowRunEvent::waiting(header(1), "").unwrap_err(),
        RuleViolation::StepEventWithoutStep {
            event_type: "WAITING"
        }
    );
}

#[test]
fn header_rules_hold_for_every_event() {
    assert_eq!(
        WorkflowRunEvent::accepted(header(0)).unwrap_err(),
        RuleViolation::SequenceBelowOne(0)
    );
    let mut h = header(1);
    h.attempt = -1;
    assert_eq!(
        WorkflowRunEvent::accepted(h).unwrap_err(),
        RuleViolation::NegativeAttempt(-1)
    );
    let mut h = header(1);
    h.workflow_name = " ".into();
    assert_eq!(
        WorkflowRunEvent::accepted(h).unwrap_err(),
        RuleViolation::BlankWorkflowName
    );
    let mut h = header(1);
    h.event_id = Uuid::nil();
    assert_eq!(
        WorkflowRunEvent::accepted(h).unwrap_err(),
        RuleViolation::NilUuid { field: "event_id" }
    );
}

#[test]
fn request_rules_hold() {
    assert_eq!(
        WorkflowRunRequest::new(Uuid::nil(), "w", json!({})).unwrap_err(),
        RuleViolation::NilUuid { field: "job_id" }
    );
    assert_eq!(
        WorkflowRunRequest::new(support::JOB_ID, "", json!({})).unwrap_err(),
        RuleViolation::BlankWorkflowName
    );
}

/// Takes a valid event's JSON, lets `edit` break it, and decodes it.
fn decode_edited_json(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> DecodeError {
    let mut doc: Value =
        serde_json::from_slice(&json::encode(&support::completed()).unwrap()).unwrap();
    edit(doc.as_object_mut().unwrap());
    json::decode::<WorkflowRunEvent>(&serde_json::to_vec(&doc).unwrap()).unwrap_err()
}

#[test]
fn decoding_json_enforces_the_rules() {
    let err = decode_edited_json(|e| {
        e.insert("type".into(), json!("UNSPECIFIED"));
    });
    assert!(
        matches!(err, DecodeError::Rule(RuleViolation::UnspecifiedType)),
        "{err}"
    );
    assert!(err.to_string().contains("never UNSPECIFIED"));

    let err = decode_edited_json(|e| {
        e.insert("verdict".into(), Value::Null);
    });
    assert!(
        matches!(
            err,
            DecodeError::Rule(RuleViolation::CompletedWithoutVerdict)
        ),
        "{err}"
    );

    let err = decode_edited_json(|e| {
        e.insert("type".into(), json!("DEAD"));
        e.insert("error".into(), json!(""));
    });
    assert!(
        matches!(
            err,
            DecodeError::Rule(RuleViolation::TerminalWithoutError { event_type: "DEAD" })
        ),
        "{err}"
    );
}

/// Encodes a record value by hand (bypassing the constructors) and decodes it.
fn decode_avro_record(
    edit: impl FnOnce(&mut Vec<(String, apache_avro::types::Value)>),
) -> DecodeError {
    use apache_avro::types::Value as Avro;
    let Avro::Record(mut fields) = support::failed().to_avro_value() else {
        panic!("events are records");
    };
    edit(&mut fields);
    let schema = WorkflowRunEvent::avro_schema();
    let datum = apache_avro::writer::datum::GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(Avro::Record(fields)))
        .unwrap();
    avro::decode_datum::<WorkflowRunEvent>(schema, &datum).unwrap_err()
}

#[test]
fn decoding_avro_enforces_the_rules() {
    use apache_avro::types::Value as Avro;
    let set = |fields: &mut Vec<(String, Avro)>, name: &str, value: Avro| {
        fields.iter_mut().find(|(n, _)| n == name).unwrap().1 = value;
    };
    let err = decode_avro_record(|f| set(f, "type", Avro::Enum(0, "UNSPECIFIED".into())));
    assert!(
        matches!(err, DecodeError::Rule(RuleViolation::UnspecifiedType)),
        "{err}"
    );

    let err = decode_avro_record(|f| set(f, "error", Avro::Union(0, Box::new(Avro::Null))));
    assert!(
        matches!(
            err,
            DecodeError::Rule(RuleViolation::TerminalWithoutError {
                event_type: "FAILED"
            })
        ),
        "{err}"
    );

    let err = decode_avro_record(|f| {
        set(f, "type", Avro::Enum(4, "COMPLETED".into()));
        set(
            f,
            "verdict",
            Avro::Union(1, Box::new(Avro::String(String::new()))),
        );
    });
    assert!(
        matches!(
            err,
            DecodeError::Rule(RuleViolation::CompletedWithoutVerdict)
        ),
        "{err}"
    );
}
