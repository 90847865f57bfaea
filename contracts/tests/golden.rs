//! Golden byte vectors: fixed messages must encode to the committed bytes, so
//! a change to a schema or to the encoding cannot slip through unnoticed.
//!
//! After a deliberate, compatible contract change, regenerate with
//! `FLOTILLA_BLESS=1 cargo test -p flotilla-contracts --test golden` and
//! review the diff of `tests/golden/`.

mod support;

use std::path::PathBuf;

use flotilla_contracts::avro::{self, AvroMessage};
use flotilla_contracts::{framing, json};

const SCHEMA_ID: u32 = 42;

fn check(name: &str, actual: &[u8], as_hex: bool) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let rendered = if as_hex {
        format!("{}\n", hex::encode(actual))
    } else {
        format!("{}\n", String::from_utf8(actual.to_vec()).unwrap())
    };
    if std::env::var_os("FLOTILLA_BLESS").is_some() {
        std::fs::write(&path, &rendered).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with FLOTILLA_BLESS=1 to create it)",
            path.display()
        )
    });
    assert_eq!(
        rendered, expected,
        "{name} changed: the wire contract moved"
    );
}

fn check_message<M: AvroMessage + PartialEq + std::fmt::Debug>(name: &str, message: &M) {
    let json_bytes = json::encode(message).unwrap();
    check(&format!("{name}.json"), &json_bytes, false);
    let framed = framing::frame(SCHEMA_ID, &avro::encode_datum(message).unwrap());
    check(&format!("{name}.avro.hex"), &framed, true);

    // And the committed bytes decode back to the same message.
    let framing::Framed::Avro { datum, .. } = framing::detect(&framed).unwrap() else {
        panic!("framed bytes must be Avro");
    };
    assert_eq!(
        &avro::decode_datum::<M>(M::avro_schema(), datum).unwrap(),
        message
    );
    assert_eq!(&json::decode::<M>(&json_bytes).unwrap(), message);
}

#[test]
fn request_bytes_match_the_golden_vectors() {
    check_message("request", &support::request());
}

#[test]
fn completed_event_bytes_match_the_golden_vectors() {
    check_message("event_completed", &support::completed());
}

#[test]
fn failed_event_bytes_match_the_golden_vectors() {
    check_message("event_failed", &support::failed());
}

/// A request from a producer older than `workflow_version` (its bytes and
/// its writer schema as they were) still decodes: the newest version runs.
#[test]
fn a_request_written_before_workflow_version_decodes_without_one() {
    let writer = apache_avro::Schema::parse_str(
        r#"{"type": "record", "name": "WorkflowRunRequest", "namespace": "io.flotilla.v1",
            "fields": [
              {"name": "job_id", "type": {"type": "string", "logicalType": "uuid"}},
              {"name": "workflow_name", "type": "string"},
              {"name": "input", "type": "string"}]}"#,
    )
    .unwrap();
    let framed = hex::decode(
        "000000002a4830313932376331652d346232612d376433652d396631302d323233333434353536363737\
         126b79632d636865636b467b22637573746f6d6572223a7b226964223a34322c226e616d65223a22416461227d7d",
    )
    .unwrap();
    let framing::Framed::Avro { datum, .. } = framing::detect(&framed).unwrap() else {
        panic!("framed bytes must be Avro");
    };
    let request: flotilla_contracts::WorkflowRunRequest =
        avro::decode_datum(&writer, datum).unwrap();
    assert_eq!(request, support::request());
    assert_eq!(request.workflow_version(), None);
}

#[test]
fn a_request_naming_a_version_round_trips_and_version_0_is_refused() {
    let pinned = support::request().with_workflow_version(Some(3)).unwrap();
    let datum = avro::encode_datum(&pinned).unwrap();
    let decoded: flotilla_contracts::WorkflowRunRequest = avro::decode_datum(
        flotilla_contracts::WorkflowRunRequest::avro_schema(),
        &datum,
    )
    .unwrap();
    assert_eq!(decoded.workflow_version(), Some(3));
    let text = json::encode(&pinned).unwrap();
    assert!(String::from_utf8_lossy(&text).contains("\"workflow_version\":3"));
    assert!(support::request().with_workflow_version(Some(0)).is_err());
    let zero = String::from_utf8(text).unwrap().replace(":3}", ":0}");
    let refused = json::decode::<flotilla_contracts::WorkflowRunRequest>(zero.as_bytes());
    assert!(refused.is_err(), "{refused:?}");
}

/// A request from a producer older than `priority` (with `workflow_version`,
/// without `priority`) decodes as priority 0; a priority round-trips in
/// both encodings, and one past 10 is refused at decode.
#[test]
fn a_request_written_before_priority_decodes_without_one_and_11_is_refused() {
    let writer = apache_avro::Schema::parse_str(
        r#"{"type": "record", "name": "WorkflowRunRequest", "namespace": "io.flotilla.v1",
            "fields": [
              {"name": "job_id", "type": {"type": "string", "logicalType": "uuid"}},
              {"name": "workflow_name", "type": "string"},
              {"name": "input", "type": "string"},
              {"name": "workflow_version", "type": ["null", "int"], "default": null}]}"#,
    )
    .unwrap();
    // The older writer's bytes: today's without the trailing null priority
    // and metadata.
    let mut older = avro::encode_datum(&support::request()).unwrap();
    assert_eq!(older.pop(), Some(0), "a null union branch is one zero byte");
    assert_eq!(older.pop(), Some(0), "a null union branch is one zero byte");
    let request: flotilla_contracts::WorkflowRunRequest =
        avro::decode_datum(&writer, &older).unwrap();
    assert_eq!(request, support::request());
    assert_eq!(request.priority(), None);

    let urgent = support::request().with_priority(Some(7)).unwrap();
    let datum = avro::encode_datum(&urgent).unwrap();
    let decoded: flotilla_contracts::WorkflowRunRequest = avro::decode_datum(
        flotilla_contracts::WorkflowRunRequest::avro_schema(),
        &datum,
    )
    .unwrap();
    assert_eq!(decoded.priority(), Some(7));
    let text = String::from_utf8(json::encode(&urgent).unwrap()).unwrap();
    assert!(text.contains("\"priority\":7"), "{text}");
    assert!(support::request().with_priority(Some(11)).is_err());
    assert!(support::request().with_priority(Some(-1)).is_err());
    let eleven = text.replace("\"priority\":7", "\"priority\":11");
    let refused = json::decode::<flotilla_contracts::WorkflowRunRequest>(eleven.as_bytes());
    assert!(refused.is_err(), "{refused:?}");
}

/// The event schema as it was before `workflow_version`: today's without
/// its last two fields (`workflow_version`, then `metadata`).
fn event_schema_before_workflow_version() -> apache_avro::Schema {
    let mut schema: serde_json::Value = serde_json::from_str(
        <flotilla_contracts::WorkflowRunEvent as flotilla_contracts::Message>::schema_text(),
    )
    .unwrap();
    let fields = schema["fields"].as_array_mut().unwrap();
    assert_eq!(fields.pop().unwrap()["name"], "metadata");
    assert_eq!(fields.pop().unwrap()["name"], "workflow_version");
    apache_avro::Schema::parse(&schema).unwrap()
}

/// An event from a relay older than `workflow_version` (the committed bytes
/// of that release, written by its schema) decodes without one.
#[test]
fn an_event_written_before_workflow_version_decodes_without_one() {
    let framed = hex::decode(
        "000000002a4830313932376331652d346232612d376433652d396631302d3838393961616262636364644830\
         313932376331652d346232612d376433652d396631302d3232333334343535363637370a08126b79632d6368\
         65636b04000228617070726f7665643a2073636f726520302e393300021c7b2273636f7265223a302e39337d\
         80a6b6e5aedab006",
    )
    .unwrap();
    let framing::Framed::Avro { datum, .. } = framing::detect(&framed).unwrap() else {
        panic!("framed bytes must be Avro");
    };
    let event: flotilla_contracts::WorkflowRunEvent =
        avro::decode_datum(&event_schema_before_workflow_version(), datum).unwrap();
    assert_eq!(event, support::completed());
    assert_eq!(event.workflow_version(), None);
}

/// A version round-trips in both encodings; a JSON event carrying a field
/// this release does not know still decodes (events grow by optional
/// fields); version 0 is refused.
#[test]
fn an_event_carries_its_workflow_version_and_tolerates_newer_fields() {
    let versioned = support::completed().with_workflow_version(Some(7)).unwrap();
    let datum = avro::encode_datum(&versioned).unwrap();
    let decoded: flotilla_contracts::WorkflowRunEvent =
        avro::decode_datum(flotilla_contracts::WorkflowRunEvent::avro_schema(), &datum).unwrap();
    assert_eq!(decoded.workflow_version(), Some(7));

    let mut document: serde_json::Value =
        serde_json::from_slice(&json::encode(&versioned).unwrap()).unwrap();
    assert_eq!(document["workflow_version"], 7);
    document["a_field_of_a_later_release"] = serde_json::json!({"x": 1});
    let newer: flotilla_contracts::WorkflowRunEvent =
        json::decode(&serde_json::to_vec(&document).unwrap()).unwrap();
    assert_eq!(newer, versioned);

    assert!(support::completed().with_workflow_version(Some(0)).is_err());
    document["workflow_version"] = serde_json::json!(0);
    let refused = json::decode::<flotilla_contracts::WorkflowRunEvent>(
        &serde_json::to_vec(&document).unwrap(),
    );
    assert!(refused.is_err(), "{refused:?}");
}

/// Metadata round-trips in both encodings, sorted by key; a request of a
/// producer older than it (today's bytes without the trailing null)
/// decodes without; metadata past its bounds is refused at decode.
#[test]
fn a_requests_metadata_round_trips_and_an_older_request_has_none() {
    let mut schema: serde_json::Value = serde_json::from_str(
        <flotilla_contracts::WorkflowRunRequest as flotilla_contracts::Message>::schema_text(),
    )
    .unwrap();
    assert_eq!(
        schema["fields"].as_array_mut().unwrap().pop().unwrap()["name"],
        "metadata"
    );
    let writer = apache_avro::Schema::parse(&schema).unwrap();
    let mut older = avro::encode_datum(&support::request()).unwrap();
    assert_eq!(older.pop(), Some(0));
    let request: flotilla_contracts::WorkflowRunRequest =
        avro::decode_datum(&writer, &older).unwrap();
    assert_eq!(request.metadata(), None);

    let labels: flotilla_contracts::Metadata = [("customer", "ada"), ("batch", "7")]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
    let labelled = support::request()
        .with_metadata(Some(labels.clone()))
        .unwrap();
    let datum = avro::encode_datum(&labelled).unwrap();
    let decoded: flotilla_contracts::WorkflowRunRequest = avro::decode_datum(
        flotilla_contracts::WorkflowRunRequest::avro_schema(),
        &datum,
    )
    .unwrap();
    assert_eq!(decoded.metadata(), Some(&labels));
    let text = String::from_utf8(json::encode(&labelled).unwrap()).unwrap();
    assert!(
        text.contains(r#""metadata":{"batch":"7","customer":"ada"}"#),
        "{text}"
    );
    assert_eq!(
        json::decode::<flotilla_contracts::WorkflowRunRequest>(text.as_bytes()).unwrap(),
        labelled
    );
    let spaced = text.replace(r#""batch":"7""#, r#""two words":"7""#);
    let refused = json::decode::<flotilla_contracts::WorkflowRunRequest>(spaced.as_bytes());
    assert!(refused.is_err(), "{refused:?}");
}
