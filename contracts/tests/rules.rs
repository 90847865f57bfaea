//! Every message rule is enforced by the constructors and again on decode,
//! with an error that names the rule.

mod support;

use flotilla_contracts::avro::{self, AvroMessage};
use flotilla_contracts::{
    DecodeError, RuleViolation, StepRequestParts, WorkflowRunEvent, WorkflowRunRequest,
    WorkflowStepReply, WorkflowStepRequest, json,
};
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

#[test]
fn a_step_request_names_its_step_and_reply_topic_and_counts_attempts_from_one() {
    let parts = || StepRequestParts {
        job_id: Uuid::from_u128(1),
        step_name: "score".into(),
        attempt: 1,
        correlation_id: Uuid::from_u128(2),
        reply_topic: "fraud-replies".into(),
        request: json!({"amount": 5}),
        deadline: support::at(),
    };
    let request = WorkflowStepRequest::new(parts()).unwrap();
    assert_eq!(
        request.idempotency_key(),
        "00000000-0000-0000-0000-000000000001:score"
    );
    let blank = WorkflowStepRequest::new(StepRequestParts {
        reply_topic: " ".into(),
        ..parts()
    });
    assert_eq!(
        blank.unwrap_err(),
        RuleViolation::Blank {
            field: "reply_topic"
        }
    );
    let zero = WorkflowStepRequest::new(StepRequestParts {
        attempt: 0,
        ..parts()
    });
    assert_eq!(zero.unwrap_err(), RuleViolation::AttemptBelowOne(0));
    let nil = WorkflowStepRequest::new(StepRequestParts {
        correlation_id: Uuid::nil(),
        ..parts()
    });
    assert_eq!(
        nil.unwrap_err(),
        RuleViolation::NilUuid {
            field: "correlation_id"
        }
    );
}

#[test]
fn a_step_reply_carries_exactly_one_of_result_and_error() {
    let (job, correlation) = (Uuid::from_u128(1), Uuid::from_u128(2));
    assert_eq!(
        WorkflowStepReply::answer(job, correlation, Value::Null).unwrap_err(),
        RuleViolation::ReplyNotOneOf,
        "null is no answer"
    );
    assert_eq!(
        WorkflowStepReply::refusal(job, correlation, "  ", true).unwrap_err(),
        RuleViolation::Blank { field: "error" }
    );
    // Both, or a retryable answer, on the wire: refused on decode.
    for bytes in [
        json!({"correlation_id": correlation, "job_id": job, "result": {"a": 1}, "error": "x"}),
        json!({"correlation_id": correlation, "job_id": job, "result": {"a": 1}, "retryable": true}),
        json!({"correlation_id": correlation, "job_id": job}),
    ] {
        let refused = json::decode::<WorkflowStepReply>(bytes.to_string().as_bytes()).unwrap_err();
        assert!(
            matches!(refused, DecodeError::Rule(RuleViolation::ReplyNotOneOf)),
            "{bytes}: {refused}"
        );
    }
    let retry = WorkflowStepReply::refusal(job, correlation, "busy", true).unwrap();
    assert_eq!((retry.error(), retry.retryable()), (Some("busy"), true));
}
