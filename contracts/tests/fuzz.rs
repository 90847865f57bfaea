//! A fuzz pass over the request decoder, both encodings: structure-aware
//! inputs (valid requests, mutated) and raw bytes never panic, and every
//! refusal is a named `DecodeError`. `FLOTILLA_FUZZ_CASES` sets how many
//! cases each property runs (CI runs the default, a local run can go big).

use flotilla_contracts::avro::{self, AvroMessage as _};
use flotilla_contracts::framing::{self, Framed};
use flotilla_contracts::{WorkflowRunRequest, json};
use proptest::prelude::*;
use uuid::Uuid;

fn cases() -> ProptestConfig {
    let cases = std::env::var("FLOTILLA_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(512);
    ProptestConfig::with_cases(cases)
}

/// Any JSON value, with strings that include escapes, NULs and odd unicode.
fn any_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(
            |f| serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, Into::into)
        ),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::from),
            prop::collection::btree_map(".{0,8}", inner, 0..5)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A request-shaped document: right or wrong field names and types.
fn request_shaped() -> impl Strategy<Value = serde_json::Value> {
    let job_id = prop_oneof![
        any::<u128>().prop_map(|n| serde_json::Value::from(Uuid::from_u128(n).to_string())),
        any_json(),
    ];
    let name = prop_oneof![".{0,40}".prop_map(serde_json::Value::from), any_json()];
    let field = prop_oneof![
        Just("job_id".to_owned()),
        Just("workflow_name".to_owned()),
        Just("input".to_owned()),
        "[a-z_]{1,10}",
    ];
    (
        job_id,
        name,
        any_json(),
        prop::collection::vec((field, any_json()), 0..3),
    )
        .prop_map(|(job_id, name, input, extra)| {
            let mut doc =
                serde_json::json!({"job_id": job_id, "workflow_name": name, "input": input});
            for (key, value) in extra {
                doc[key] = value;
            }
            doc
        })
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn json_requests_decode_or_are_refused_by_name(doc in request_shaped()) {
        let bytes = serde_json::to_vec(&doc).unwrap();
        match json::decode::<WorkflowRunRequest>(&bytes) {
            Ok(request) => prop_assert!(!request.job_id().is_nil()),
            Err(e) => prop_assert!(!e.code().is_empty()),
        }
    }

    #[test]
    fn raw_bytes_never_panic_the_decoder(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        match framing::detect(&bytes) {
            Ok(Framed::Json(text)) => {
                let _ = json::decode::<WorkflowRunRequest>(text);
            }
            Ok(Framed::Avro { datum, .. }) => {
                let _ = avro::decode_datum::<WorkflowRunRequest>(WorkflowRunRequest::avro_schema(), datum);
            }
            Err(e) => prop_assert!(!e.code().is_empty()),
        }
    }

    #[test]
    fn mutated_avro_requests_never_panic_the_decoder(
        seed in any::<u128>(),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        let request = WorkflowRunRequest::new(Uuid::from_u128(seed | 1), "w", serde_json::json!({"n": 1})).unwrap();
        let mut datum = avro::encode_datum(&request).unwrap();
        for (at, byte) in flips {
            let at = at % datum.len();
            datum[at] ^= byte;
        }
        datum.truncate(cut % (datum.len() + 1));
        let _ = avro::decode_datum::<WorkflowRunRequest>(WorkflowRunRequest::avro_schema(), &datum);
    }
}
