//! Telling the two encodings apart by the first byte, and the Confluent frame.
//!
//! Confluent framing is a magic byte `0x00`, the schema id as a 4-byte
//! big-endian integer, then the Avro datum. A JSON message is an object, so
//! its first byte is `{` (or whitespace before it). Anything else is refused.

use crate::DecodeError;

/// The first byte of a Confluent-framed message.
pub const MAGIC_BYTE: u8 = 0;
/// Magic byte plus schema id.
pub const HEADER_LEN: usize = 5;

/// What the first bytes say a payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framed<'a> {
    Avro { schema_id: u32, datum: &'a [u8] },
    Json(&'a [u8]),
}

/// Classifies a payload without decoding it.
///
/// # Errors
/// [`DecodeError::Empty`], [`DecodeError::TruncatedFrame`] (magic byte but no
/// full header), [`DecodeError::UnknownMagicByte`].
pub fn detect(bytes: &[u8]) -> Result<Framed<'_>, DecodeError> {
    match bytes.first() {
        None => Err(DecodeError::Empty),
        Some(&MAGIC_BYTE) => {
            if bytes.len() < HEADER_LEN {
                return Err(DecodeError::TruncatedFrame(bytes.len()));
            }
            let id = [bytes[1], bytes[2], bytes[3], bytes[4]];
            Ok(Framed::Avro {
                schema_id: u32::from_be_bytes(id),
                datum: &bytes[HEADER_LEN..],
            })
        }
        Some(b'{' | b' ' | b'\t' | b'\n' | b'\r') => Ok(Framed::Json(bytes)),
        Some(&other) => Err(DecodeError::UnknownMagicByte(other)),
    }
}

/// Prefixes an Avro datum with the magic byte and `schema_id`.
#[must_use]
pub fn frame(schema_id: u32, datum: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(HEADER_LEN + datum.len());
    framed.push(MAGIC_BYTE);
    framed.extend_from_slice(&schema_id.to_be_bytes());
    framed.extend_from_slice(datum);
    framed
}
