//! The JSON encoding, used on the wire when no Schema Registry is configured.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::{DecodeError, Message, RuleViolation};

/// Encodes a message as a JSON object.
///
/// # Errors
/// The message breaks a rule (it is never put on the wire then).
pub fn encode<M: Message>(message: &M) -> Result<Vec<u8>, RuleViolation> {
    message.check_rules()?;
    // Serialising these types cannot fail: every map key is a string.
    Ok(serde_json::to_vec(message).expect("contract messages always serialise to JSON"))
}

/// Decodes a JSON object and checks the rules.
///
/// # Errors
/// [`DecodeError::Empty`], [`DecodeError::JsonMismatch`] naming the field
/// path that did not fit, or [`DecodeError::Rule`].
pub fn decode<M: Message>(bytes: &[u8]) -> Result<M, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let message: M =
        serde_path_to_error::deserialize(&mut deserializer).map_err(mismatch::<M, _>)?;
    deserializer.end().map_err(|e| DecodeError::JsonMismatch {
        schema: M::AVRO_NAME,
        reason: e.to_string(),
    })?;
    message.check_rules()?;
    Ok(message)
}

/// The field path that did not fit, and why.
fn mismatch<M: Message, E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> DecodeError {
    let path = e.path().to_string();
    let reason = if path == "." {
        e.into_inner().to_string()
    } else {
        format!("at {path}: {}", e.into_inner())
    };
    DecodeError::JsonMismatch {
        schema: M::AVRO_NAME,
        reason,
    }
}

/// Decodes a message this program stored earlier, possibly written by a
/// newer version of it (a rolling deploy): top-level fields the message's
/// schema does not name are dropped, then the message is decoded and its
/// rules checked as if it came off the wire.
///
/// # Errors
/// As [`decode`]: the stored document does not fit, or breaks a rule.
pub fn decode_stored<M: Message>(mut stored: serde_json::Value) -> Result<M, DecodeError> {
    if let (Some(fields), Some(known)) = (stored.as_object_mut(), known_fields::<M>()) {
        fields.retain(|name, _| known.iter().any(|k| k == name));
    }
    // Straight from the document: the relay decodes every event it sends.
    let message: M = serde_path_to_error::deserialize(stored).map_err(mismatch::<M, _>)?;
    message.check_rules()?;
    Ok(message)
}

/// [`decode_stored`] from the stored JSON text: straight into the message
/// when the document is exactly this version's (the usual case, with no
/// intermediate document), else through [`decode_stored`].
///
/// # Errors
/// As [`decode_stored`].
pub fn decode_stored_text<M: Message>(text: &str) -> Result<M, DecodeError> {
    match decode(text.as_bytes()) {
        Err(DecodeError::JsonMismatch { .. }) => {
            let stored: serde_json::Value =
                serde_json::from_str(text).map_err(|e| DecodeError::JsonMismatch {
                    schema: M::AVRO_NAME,
                    reason: e.to_string(),
                })?;
            decode_stored(stored)
        }
        decoded => decoded,
    }
}

/// The field names of `M`'s record schema (the JSON encoding uses the same),
/// read from the embedded schema once per message type.
fn known_fields<M: Message>() -> Option<Arc<[String]>> {
    type Fields = Option<Arc<[String]>>;
    static KNOWN: OnceLock<Mutex<HashMap<&'static str, Fields>>> = OnceLock::new();
    let mut known = KNOWN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    known
        .entry(M::AVRO_NAME)
        .or_insert_with(|| {
            let schema: serde_json::Value = serde_json::from_str(M::schema_text()).ok()?;
            let fields = schema.get("fields")?.as_array()?;
            Some(
                fields
                    .iter()
                    .filter_map(|f| f.get("name")?.as_str().map(str::to_owned))
                    .collect(),
            )
        })
        .clone()
}
