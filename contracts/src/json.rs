//! The JSON encoding, used on the wire when no Schema Registry is configured.

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
    let message: M = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
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
    })?;
    deserializer.end().map_err(|e| DecodeError::JsonMismatch {
        schema: M::AVRO_NAME,
        reason: e.to_string(),
    })?;
    message.check_rules()?;
    Ok(message)
}
