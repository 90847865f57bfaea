//! The codec against the real Schema Registry (`scripts/services up`): both
//! encodings decode through one codec, and every way Avro bytes can be wrong
//! comes back as its own error, told apart from a registry that is down.

use chrono::Utc;
use flotilla_codec::{Codec, CodecError};
use flotilla_contracts::{
    DecodeError, EventHeader, WorkflowRunEvent, WorkflowRunRequest, framing, json,
};
use serde_json::json;
use uuid::Uuid;

fn registry_url() -> String {
    std::env::var("SCHEMA_REGISTRY_URL")
        .expect("SCHEMA_REGISTRY_URL is not set: run `scripts/services up` (or scripts/test)")
}

fn topic() -> String {
    format!("codec-test-{}", Uuid::new_v4().simple())
}

fn request() -> WorkflowRunRequest {
    WorkflowRunRequest::new(Uuid::new_v4(), "onboarding", json!({"user": 7})).unwrap()
}

#[tokio::test]
async fn one_codec_decodes_avro_and_json_alike() {
    let codec = Codec::with_registry(&registry_url()).unwrap();
    let topic = topic();
    let request = request();
    let avro = codec.encode(&topic, &request).await.unwrap();
    assert_eq!(avro[0], framing::MAGIC_BYTE);
    let json_bytes = json::encode(&request).unwrap();
    assert_eq!(
        codec.decode::<WorkflowRunRequest>(&avro).await.unwrap(),
        request
    );
    assert_eq!(
        codec
            .decode::<WorkflowRunRequest>(&json_bytes)
            .await
            .unwrap(),
        request
    );
}

#[tokio::test]
async fn an_unregistered_schema_id_is_an_unknown_schema_id() {
    let codec = Codec::with_registry(&registry_url()).unwrap();
    let bytes = framing::frame(987_654_321, b"\x02\x04");
    let err = codec
        .decode::<WorkflowRunRequest>(&bytes)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CodecError::Decode(DecodeError::UnknownSchemaId(987_654_321))
        ),
        "{err}"
    );
    assert!(!err.is_transient());
}

#[tokio::test]
async fn a_request_framed_message_is_not_an_event() {
    let codec = Codec::with_registry(&registry_url()).unwrap();
    let bytes = codec.encode(&topic(), &request()).await.unwrap();
    let err = codec.decode::<WorkflowRunEvent>(&bytes).await.unwrap_err();
    assert!(
        matches!(err, CodecError::Decode(DecodeError::WrongSchema { .. })),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("io.flotilla.v1.WorkflowRunRequest"),
        "{err}"
    );
}

#[tokio::test]
async fn truncated_avro_with_a_valid_header_does_not_match() {
    let codec = Codec::with_registry(&registry_url()).unwrap();
    let event = WorkflowRunEvent::dead(
        EventHeader {
            event_id: Uuid::new_v4(),
            job_id: Uuid::new_v4(),
            sequence: 3,
            workflow_name: "onboarding".into(),
            attempt: 3,
            occurred_at: Utc::now(),
        },
        "target timed out",
    )
    .unwrap();
    let bytes = codec.encode(&topic(), &event).await.unwrap();
    let err = codec
        .decode::<WorkflowRunEvent>(&bytes[..bytes.len() - 4])
        .await
        .unwrap_err();
    assert!(
        matches!(err, CodecError::Decode(DecodeError::AvroMismatch { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn a_registry_that_does_not_answer_is_transient_not_poison() {
    // Port 9 (discard) is closed on these machines: connection refused.
    let codec = Codec::with_registry("http://127.0.0.1:9").unwrap();
    let err = codec
        .decode::<WorkflowRunRequest>(&framing::frame(1, b"\x00"))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    let err = codec.encode(&topic(), &request()).await.unwrap_err();
    assert!(matches!(err, CodecError::RegistryUnavailable(_)), "{err}");
}

#[tokio::test]
async fn avro_without_a_registry_is_refused_by_name() {
    let bytes = framing::frame(5, b"\x00");
    let err = Codec::json()
        .decode::<WorkflowRunRequest>(&bytes)
        .await
        .unwrap_err();
    assert!(matches!(err, CodecError::NoRegistry(5)), "{err}");
    assert!(err.to_string().contains("no schema registry is configured"));
}

#[tokio::test]
async fn the_json_codec_writes_json() {
    let codec = Codec::json();
    let request = request();
    let bytes = codec.encode("any", &request).await.unwrap();
    assert_eq!(bytes, json::encode(&request).unwrap());
    assert_eq!(codec.content_type(), "application/json");
}
