//! Every valid message survives both encodings unchanged.

mod support;

use chrono::{DateTime, Utc};
use flotilla_contracts::avro::{self, AvroMessage};
use flotilla_contracts::framing::{self, Framed};
use flotilla_contracts::{
    EventHeader, StepRequestParts, WorkflowRunEvent, WorkflowRunRequest, WorkflowRunSignal,
    WorkflowStepReply, WorkflowStepRequest, json,
};
use proptest::prelude::*;
use uuid::Uuid;

fn uuid() -> impl Strategy<Value = Uuid> {
    (1u128..).prop_map(Uuid::from_u128)
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 _:.\\-\u{e9}\u{4e2d}]{0,24}".prop_map(|s| format!("x{s}"))
}

fn json_doc() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        text().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn timestamp() -> impl Strategy<Value = DateTime<Utc>> {
    (0i64..4_102_444_800_000_000)
        .prop_map(|micros| DateTime::from_timestamp_micros(micros).unwrap())
}

fn request() -> impl Strategy<Value = WorkflowRunRequest> {
    (uuid(), text(), json_doc())
        .prop_map(|(id, name, input)| WorkflowRunRequest::new(id, name, input).unwrap())
}

fn signal() -> impl Strategy<Value = WorkflowRunSignal> {
    (
        uuid(),
        text(),
        json_doc(),
        json_doc(),
        prop::option::of(text()),
    )
        .prop_map(|(id, name, payload, source, key)| {
            WorkflowRunSignal::new(id, name, payload, source, key).unwrap()
        })
}

fn step_request() -> impl Strategy<Value = WorkflowStepRequest> {
    (
        uuid(),
        text(),
        1i32..,
        uuid(),
        text(),
        json_doc(),
        timestamp(),
    )
        .prop_map(
            |(job_id, step_name, attempt, correlation_id, reply_topic, request, deadline)| {
                WorkflowStepRequest::new(StepRequestParts {
                    job_id,
                    step_name,
                    attempt,
                    correlation_id,
                    reply_topic,
                    request,
                    deadline,
                })
                .unwrap()
            },
        )
}

fn step_reply() -> impl Strategy<Value = WorkflowStepReply> {
    let answer = json_doc()
        .prop_filter("an answer is not null", |doc| !doc.is_null())
        .prop_map(Ok);
    let refusal = (text(), any::<bool>()).prop_map(Err);
    (uuid(), uuid(), prop_oneof![answer, refusal]).prop_map(|(job_id, correlation_id, outcome)| {
        match outcome {
            Ok(result) => WorkflowStepReply::answer(job_id, correlation_id, result).unwrap(),
            Err((error, retryable)) => {
                WorkflowStepReply::refusal(job_id, correlation_id, error, retryable).unwrap()
            }
        }
    })
}

fn event() -> impl Strategy<Value = WorkflowRunEvent> {
    let header = (uuid(), uuid(), 1i64.., text(), 0i32.., timestamp()).prop_map(
        |(event_id, job_id, sequence, workflow_name, attempt, occurred_at)| EventHeader {
            event_id,
            job_id,
            sequence,
            workflow_name,
            attempt,
            occurred_at,
        },
    );
    (
        header,
        0usize..7,
        text(),
        prop::option::of(text()),
        json_doc(),
    )
        .prop_map(|(header, kind, word, maybe, doc)| {
            match kind {
                0 => WorkflowRunEvent::accepted(header),
                1 => WorkflowRunEvent::step_checkpoint(header, word, None),
                2 => WorkflowRunEvent::waiting(header, word),
                3 => WorkflowRunEvent::completed(header, word, doc),
                4 => WorkflowRunEvent::failed(header, word, maybe),
                5 => WorkflowRunEvent::dead(header, word),
                _ => WorkflowRunEvent::cancelled(header, word),
            }
            .unwrap()
        })
}

fn avro_roundtrip<M: AvroMessage + PartialEq + std::fmt::Debug>(message: &M) {
    let framed = framing::frame(7, &avro::encode_datum(message).unwrap());
    let Framed::Avro { schema_id, datum } = framing::detect(&framed).unwrap() else {
        panic!("a framed datum must be detected as Avro");
    };
    assert_eq!(schema_id, 7);
    let decoded: M = avro::decode_datum(M::avro_schema(), datum).unwrap();
    assert_eq!(&decoded, message);
}

fn json_roundtrip<M: AvroMessage + PartialEq + std::fmt::Debug>(message: &M) {
    let bytes = json::encode(message).unwrap();
    assert!(matches!(framing::detect(&bytes), Ok(Framed::Json(_))));
    let decoded: M = json::decode(&bytes).unwrap();
    assert_eq!(&decoded, message);
}

proptest! {
    #[test]
    fn requests_round_trip_through_json(request in request()) {
        json_roundtrip(&request);
    }

    #[test]
    fn requests_round_trip_through_avro(request in request()) {
        avro_roundtrip(&request);
    }

    #[test]
    fn signals_round_trip_through_json(signal in signal()) {
        json_roundtrip(&signal);
    }

    #[test]
    fn signals_round_trip_through_avro(signal in signal()) {
        avro_roundtrip(&signal);
    }

    #[test]
    fn step_requests_round_trip_through_both_encodings(request in step_request()) {
        json_roundtrip(&request);
        avro_roundtrip(&request);
    }

    #[test]
    fn step_replies_round_trip_through_both_encodings(reply in step_reply()) {
        json_roundtrip(&reply);
        avro_roundtrip(&reply);
    }

    #[test]
    fn events_round_trip_through_json(event in event()) {
        json_roundtrip(&event);
    }

    #[test]
    fn events_round_trip_through_avro(event in event()) {
        avro_roundtrip(&event);
    }
}

#[test]
fn sub_microsecond_time_is_truncated_once_at_construction() {
    let mut header = support::header(1);
    header.occurred_at += chrono::TimeDelta::nanoseconds(789);
    let event = WorkflowRunEvent::accepted(header).unwrap();
    assert_eq!(event.occurred_at(), support::at());
    avro_roundtrip(&event);
    json_roundtrip(&event);
}
