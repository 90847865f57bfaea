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
