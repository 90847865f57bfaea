//! Why bytes could not become a message.

use crate::RuleViolation;

/// Everything that can be wrong with bytes offered as a message. Each variant
/// says what was wrong in words fit for a dead-letter reason header.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("empty payload: no bytes to decode")]
    Empty,
    #[error("unknown magic byte 0x{0:02x}: expected 0x00 (Confluent-framed Avro) or a JSON object")]
    UnknownMagicByte(u8),
    #[error("truncated Avro frame: {0} bytes, the header alone needs 5")]
    TruncatedFrame(usize),
    #[error("unknown schema id {0}: the registry does not know it")]
    UnknownSchemaId(u32),
    #[error("schema id {schema_id} is {found}, not {expected}")]
    WrongSchema {
        schema_id: u32,
        expected: &'static str,
        found: String,
    },
    /// The registry holds the framed schema id, as a schema of another
    /// kind (Protobuf, JSON Schema): the bytes are not Avro of ours.
    #[error("schema id {schema_id} is a {kind} schema, not Avro")]
    NotAvroSchema { schema_id: u32, kind: String },
    /// The registry holds the framed schema id, but its text is not a
    /// schema Avro can read.
    #[error("schema id {schema_id} does not parse as an Avro schema: {reason}")]
    SchemaDoesNotParse { schema_id: u32, reason: String },
    #[error("Avro that does not match {schema}: {reason}")]
    AvroMismatch {
        schema: &'static str,
        reason: String,
    },
    #[error("JSON that does not match {schema}: {reason}")]
    JsonMismatch {
        schema: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Rule(#[from] RuleViolation),
}

impl DecodeError {
    /// A short stable code for the reason, for headers and metrics labels.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::UnknownMagicByte(_) => "unknown_magic_byte",
            Self::TruncatedFrame(_) => "truncated_frame",
            Self::UnknownSchemaId(_) => "unknown_schema_id",
            Self::WrongSchema { .. } => "wrong_schema",
            Self::NotAvroSchema { .. } => "not_avro_schema",
            Self::SchemaDoesNotParse { .. } => "schema_does_not_parse",
            Self::AvroMismatch { .. } => "avro_mismatch",
            Self::JsonMismatch { .. } => "json_mismatch",
            Self::Rule(_) => "rule_broken",
        }
    }
}
