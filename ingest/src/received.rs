//! A message taken off the request topic. The value of one above the size
//! limit is left behind before it is ever copied: only its size is kept,
//! for the dead letter that says so.

use std::ops::Deref;

use rdkafka::Message as _;
use rdkafka::message::{BorrowedMessage, OwnedMessage};

/// A message of a batch, owned.
#[derive(Debug)]
pub struct Received {
    message: OwnedMessage,
    dropped_value_bytes: Option<usize>,
}

impl Received {
    /// Copies `message` off the client, without its value when that is
    /// above `limit` bytes.
    pub(crate) fn take(message: &BorrowedMessage<'_>, limit: usize) -> Self {
        let size = message.payload_len();
        if size <= limit {
            return Self {
                message: message.detach(),
                dropped_value_bytes: None,
            };
        }
        let kept = OwnedMessage::new(
            None,
            message.key().map(<[u8]>::to_vec),
            message.topic().to_owned(),
            message.timestamp(),
            message.partition(),
            message.offset(),
            rdkafka::Message::headers(message).map(rdkafka::message::BorrowedHeaders::detach),
        );
        Self {
            message: kept,
            dropped_value_bytes: Some(size),
        }
    }

    /// The size of the value left behind, when it was over the limit.
    #[must_use]
    pub fn dropped_value_bytes(&self) -> Option<usize> {
        self.dropped_value_bytes
    }

    /// What this message holds in memory: value and key.
    pub(crate) fn held_bytes(&self) -> usize {
        self.message.payload().map_or(0, <[u8]>::len) + self.message.key().map_or(0, <[u8]>::len)
    }
}

impl Deref for Received {
    type Target = OwnedMessage;

    fn deref(&self) -> &OwnedMessage {
        &self.message
    }
}
