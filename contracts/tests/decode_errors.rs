//! Undecodable bytes give an error that says what was wrong.

mod support;

use flotilla_contracts::avro::{self, AvroMessage};
use flotilla_contracts::framing::{self, Framed};
use flotilla_contracts::{DecodeError, WorkflowRunEvent, WorkflowRunRequest, json};

#[test]
fn empty_bytes_are_reported_as_empty() {
    let err = framing::detect(b"").unwrap_err();
    assert!(matches!(err, DecodeError::Empty));
    assert_eq!(err.to_string(), "empty payload: no bytes to decode");
    assert!(matches!(
        json::decode::<WorkflowRunRequest>(b""),
        Err(DecodeError::Empty)
    ));
}

#[test]
fn an_unknown_first_byte_is_named_in_the_error() {
    let err = framing::detect(b"\x07garbage").unwrap_err();
    assert!(matches!(err, DecodeError::UnknownMagicByte(0x07)));
    assert!(err.to_string().contains("0x07"), "{err}");
    assert!(matches!(
        framing::detect(b"[1,2]"),
        Err(DecodeError::UnknownMagicByte(b'['))
    ));
}

#[test]
fn a_frame_shorter_than_its_header_is_truncated() {
    let err = framing::detect(&[0, 0, 1]).unwrap_err();
    assert!(matches!(err, DecodeError::TruncatedFrame(3)), "{err}");
}

#[test]
fn the_schema_id_is_read_big_endian() {
    let framed = framing::frame(0x0102_0304, b"abc");
    assert_eq!(&framed[..5], &[0, 1, 2, 3, 4]);
    assert_eq!(
        framing::detect(&framed).unwrap(),
        Framed::Avro {
            schema_id: 0x0102_0304,
            datum: b"abc"
        }
    );
}

#[test]
fn truncated_avro_does_not_match_the_schema() {
    let datum = avro::encode_datum(&support::completed()).unwrap();
    let cut = &datum[..datum.len() / 2];
    let err =
        avro::decode_datum::<WorkflowRunEvent>(WorkflowRunEvent::avro_schema(), cut).unwrap_err();
    assert!(matches!(err, DecodeError::AvroMismatch { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("Avro that does not match io.flotilla.v1.WorkflowRunEvent")
    );
}

#[test]
fn trailing_bytes_after_an_avro_record_are_refused() {
    let mut datum = avro::encode_datum(&support::request()).unwrap();
    datum.extend_from_slice(b"xx");
    let err = avro::decode_datum::<WorkflowRunRequest>(WorkflowRunRequest::avro_schema(), &datum)
        .unwrap_err();
    assert!(err.to_string().contains("2 trailing bytes"), "{err}");
}

#[test]
fn avro_written_with_another_schema_does_not_match() {
    // A request datum read as an event: same framing, wrong shape.
    let datum = avro::encode_datum(&support::request()).unwrap();
    let err = avro::decode_datum::<WorkflowRunEvent>(WorkflowRunRequest::avro_schema(), &datum)
        .unwrap_err();
    assert!(matches!(err, DecodeError::AvroMismatch { .. }), "{err}");
}

#[test]
fn json_errors_name_the_field() {
    let err = json::decode::<WorkflowRunRequest>(
        br#"{"job_id":"not-a-uuid","workflow_name":"w","input":{}}"#,
    )
    .unwrap_err();
    assert!(matches!(err, DecodeError::JsonMismatch { .. }));
    assert!(err.to_string().contains("at job_id:"), "{err}");

    let err =
        json::decode::<WorkflowRunRequest>(br#"{"workflow_name":"w","input":{}}"#).unwrap_err();
    assert!(err.to_string().contains("missing field `job_id`"), "{err}");

    let err = json::decode::<WorkflowRunRequest>(br#"{"job_id":"#).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("JSON that does not match io.flotilla.v1.WorkflowRunRequest")
    );

    let err =
        json::decode::<WorkflowRunEvent>(&json::encode(&support::request()).unwrap()).unwrap_err();
    assert!(matches!(err, DecodeError::JsonMismatch { .. }), "{err}");
}

#[test]
fn trailing_json_after_the_object_is_refused() {
    let mut bytes = json::encode(&support::request()).unwrap();
    bytes.extend_from_slice(b" {}");
    let err = json::decode::<WorkflowRunRequest>(&bytes).unwrap_err();
    assert!(matches!(err, DecodeError::JsonMismatch { .. }), "{err}");
}

#[test]
fn unknown_fields_are_refused_rather_than_dropped() {
    let err = json::decode::<WorkflowRunRequest>(
        br#"{"job_id":"0192a1e4-4b2a-7d3e-9f10-223344556677","workflow_name":"w","input":{},"urgency":1}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("unknown field `urgency`"), "{err}");
}

fn stored_event() -> serde_json::Value {
    let header = flotilla_contracts::EventHeader {
        event_id: uuid::Uuid::new_v4(),
        job_id: uuid::Uuid::new_v4(),
        sequence: 2,
        workflow_name: "w".into(),
        attempt: 1,
        occurred_at: chrono::Utc::now(),
    };
    serde_json::to_value(WorkflowRunEvent::step_checkpoint(header, "step", None).unwrap()).unwrap()
}

#[test]
fn a_stored_event_decodes_from_its_text_also_when_a_newer_writer_added_fields() {
    let stored = stored_event();
    let exact = json::decode_stored_text::<WorkflowRunEvent>(&stored.to_string()).unwrap();
    assert_eq!(serde_json::to_value(&exact).unwrap(), stored);
    let mut newer = stored.clone();
    newer["added_by_v2"] = serde_json::json!({"nested": [1, 2]});
    let dropped = json::decode_stored_text::<WorkflowRunEvent>(&newer.to_string()).unwrap();
    assert_eq!(serde_json::to_value(&dropped).unwrap(), stored);
}

#[test]
fn a_stored_event_that_does_not_fit_names_what_is_wrong() {
    let mut stored = stored_event();
    stored["sequence"] = serde_json::json!("two");
    let err = json::decode_stored_text::<WorkflowRunEvent>(&stored.to_string()).unwrap_err();
    assert!(err.to_string().contains("sequence"), "{err}");
    let err = json::decode_stored_text::<WorkflowRunEvent>("{not json").unwrap_err();
    assert!(matches!(err, DecodeError::JsonMismatch { .. }), "{err}");
}
