//! A registry that misbehaves is an outage, not a verdict on the message:
//! only a definite "schema not found" (404 with error code 40403) condemns
//! the bytes, and no error is remembered.

use flotilla_codec::{Codec, CodecError};
use flotilla_contracts::{DecodeError, Message as _, WorkflowRunRequest, avro, framing};
use flotilla_tests::registry_stub::{RegistryStub, not_found_answer, schema_answer};
use serde_json::json;
use uuid::Uuid;

/// Avro bytes of a request, framed with schema id 7 (the stub answers any id).
fn avro_request() -> (WorkflowRunRequest, Vec<u8>) {
    let request = WorkflowRunRequest::new(Uuid::new_v4(), "w", json!({"n": 1})).unwrap();
    let bytes = framing::frame(7, &avro::encode_datum(&request).unwrap());
    (request, bytes)
}

/// Each failure answers the decoder's request and the follow-up that asks
/// what the id is (a non-retriable answer gets one), then the registry
/// recovers: the failure was an outage naming its cause, and the same codec
/// decodes the same bytes next time.
#[tokio::test]
async fn registry_failures_are_outages_and_are_not_remembered() {
    let (request, bytes) = avro_request();
    let good = schema_answer(WorkflowRunRequest::schema_text());
    let failures = [
        (
            (
                500,
                r#"{"error_code": 50001, "message": "boom"}"#.to_owned(),
            ),
            "500",
        ),
        ((429, "{}".to_owned()), "429"),
        (
            (401, r#"{"error_code": 40101, "message": "no"}"#.to_owned()),
            "401",
        ),
        ((404, "<html>not a registry</html>".to_owned()), "404"),
        ((200, "not json".to_owned()), "decod"),
    ];
    for (failure, expected) in failures {
        let stub = RegistryStub::start(vec![failure.clone(), failure, good.clone()]).await;
        let codec = Codec::with_registry(&stub.url()).unwrap();
        match codec.decode::<WorkflowRunRequest>(&bytes).await {
            Err(e @ CodecError::RegistryUnavailable(_)) => {
                assert!(e.is_transient());
                assert!(
                    e.to_string().to_lowercase().contains(expected),
                    "the reason names the real cause ({expected}): {e}"
                );
            }
            other => panic!("{expected}: expected an outage, got {other:?}"),
        }
        // A retriable failure asked once: the stub's second answer is the
        // same failure again, still an outage; the third decodes.
        let decoded = loop {
            match codec.decode::<WorkflowRunRequest>(&bytes).await {
                Ok(decoded) => break decoded,
                Err(e) => assert!(e.is_transient(), "{expected}: {e}"),
            }
        };
        assert_eq!(
            decoded, request,
            "{expected}: the id resolves once the registry answers"
        );
    }
}

#[tokio::test]
async fn only_a_definite_not_found_dead_letters() {
    let (_, bytes) = avro_request();
    let stub = RegistryStub::start(vec![not_found_answer()]).await;
    let codec = Codec::with_registry(&stub.url()).unwrap();
    match codec.decode::<WorkflowRunRequest>(&bytes).await {
        Err(CodecError::Decode(DecodeError::UnknownSchemaId(7))) => {}
        other => panic!("expected an unknown schema id, got {other:?}"),
    }
}

/// Registering our schema: refused credentials are an outage (the encoder
/// used to call every non-retriable answer a refusal of the schema); only
/// the registry's verdict on the schema itself (409) refuses it.
#[tokio::test]
async fn refused_credentials_while_registering_are_an_outage_and_only_409_refuses_the_schema() {
    let request = WorkflowRunRequest::new(Uuid::new_v4(), "w", json!({})).unwrap();
    let script = vec![
        (
            401,
            r#"{"error_code": 40101, "message": "Unauthorized"}"#.to_owned(),
        ),
        (
            403,
            r#"{"error_code": 40301, "message": "Forbidden"}"#.to_owned(),
        ),
        (
            409,
            r#"{"error_code": 409, "message": "incompatible with an earlier schema"}"#.to_owned(),
        ),
    ];
    let stub = RegistryStub::start(script).await;
    let codec = Codec::with_registry(&stub.url()).unwrap();
    for expected in ["401", "403"] {
        match codec.encode("faults", &request).await {
            Err(e @ CodecError::RegistryUnavailable(_)) => {
                assert!(e.to_string().contains(expected), "{e}");
            }
            other => panic!("{expected}: expected an outage, got {other:?}"),
        }
    }
    assert!(matches!(
        codec.encode("faults", &request).await,
        Err(CodecError::RegistryRefused { .. })
    ));
}

/// A framed id that the registry holds as another kind of schema
/// (Protobuf, JSON Schema), or as Avro text that does not parse, is a
/// definite answer about the message: each is its own decode error (and so
/// its own dead-letter code), not an outage that pauses the partition.
#[tokio::test]
async fn a_schema_id_of_another_kind_or_one_that_does_not_parse_condemns_the_message() {
    let (_, bytes) = avro_request();
    let cases = [
        (
            json!({"schemaType": "PROTOBUF", "schema": "syntax = \"proto3\"; message M { string a = 1; }"}),
            "not_avro_schema",
            "Protobuf",
        ),
        (
            json!({"schemaType": "JSON", "schema": "{\"type\": \"object\"}"}),
            "not_avro_schema",
            "JSON Schema",
        ),
        (
            json!({"schema": "{\"type\": \"record\", \"name\": \"Broken\", \"fields\": 7}"}),
            "schema_does_not_parse",
            "does not parse",
        ),
    ];
    for (answer, code, named) in cases {
        let stub = RegistryStub::start(vec![(200, answer.to_string())]).await;
        let codec = Codec::with_registry(&stub.url()).unwrap();
        match codec.decode::<WorkflowRunRequest>(&bytes).await {
            Err(CodecError::Decode(e)) => {
                assert_eq!(e.code(), code, "{e}");
                assert!(e.to_string().contains(named), "{e}");
            }
            other => panic!("{code}: expected a decode error, got {other:?}"),
        }
    }
}
