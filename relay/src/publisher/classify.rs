//! Whose fault a row that did not go out is (the class: whether it lands
//! FAILED or its batch goes again) and why (the reason: the metric's label).

use flotilla_codec::CodecError;
use flotilla_runtime::kafka::security::{is_refused_access, is_refused_for_itself};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Whose fault a miss is: the `class` label of
/// `flotilla_relay_publish_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// The record itself: the row lands FAILED.
    Message,
    /// The broker or the registry: its batch goes again.
    World,
}

impl Class {
    /// The metric's label value.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::World => "world",
        }
    }
}

/// Why a row did not go out: the `reason` label of
/// `flotilla_relay_publish_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Larger than the producer or the broker takes.
    TooLarge,
    /// Not a valid record: refused as corrupt or invalid, a payload that
    /// does not decode, an event that breaks a rule.
    Invalid,
    /// No connection to the broker, or no leader for the partition.
    Unreachable,
    /// Fewer replicas in sync than the topic's `min.insync.replicas`: the
    /// brokers refuse every `acks=all` write to it (brokers down, or a
    /// topic replicated fewer times than it asks).
    NotEnoughReplicas,
    /// The producer's local queue is full.
    QueueFull,
    /// No acknowledgement within the delivery timeout (or the round).
    Timeout,
    /// Credentials or ACLs refused (authentication, authorization, TLS).
    RefusedAccess,
    /// Not handed to the producer: the bucket's lease could run out before
    /// the producer would give up on the record (renewals late, or this
    /// process stalled).
    Lease,
    /// The schema registry could not be asked, or refused the schema.
    Registry,
    /// Anything else.
    Other,
}

impl Reason {
    /// The metric's label value.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::TooLarge => "too_large",
            Self::Invalid => "invalid",
            Self::Unreachable => "unreachable",
            Self::NotEnoughReplicas => "not_enough_replicas",
            Self::QueueFull => "queue_full",
            Self::Timeout => "timeout",
            Self::RefusedAccess => "refused_access",
            Self::Lease => "lease",
            Self::Registry => "registry",
            Self::Other => "other",
        }
    }

    /// The reason of a broker or producer error code.
    fn of(code: RDKafkaErrorCode) -> Self {
        use RDKafkaErrorCode as Code;
        match code {
            Code::MessageSizeTooLarge | Code::MessageBatchTooLarge => Self::TooLarge,
            Code::InvalidMessageSize | Code::InvalidMessage | Code::InvalidRecord => Self::Invalid,
            Code::BrokerTransportFailure
            | Code::AllBrokersDown
            | Code::Resolve
            | Code::NetworkException
            | Code::BrokerNotAvailable
            | Code::LeaderNotAvailable
            | Code::NotLeaderForPartition => Self::Unreachable,
            Code::NotEnoughReplicas | Code::NotEnoughReplicasAfterAppend => Self::NotEnoughReplicas,
            Code::QueueFull => Self::QueueFull,
            Code::MessageTimedOut | Code::RequestTimedOut | Code::OperationTimedOut => {
                Self::Timeout
            }
            Code::Authentication
            | Code::SaslAuthenticationFailed
            | Code::UnsupportedSASLMechanism
            | Code::IllegalSASLState
            | Code::SSL
            | Code::TopicAuthorizationFailed
            | Code::ClusterAuthorizationFailed
            | Code::TransactionalIdAuthorizationFailed => Self::RefusedAccess,
            _ => Self::Other,
        }
    }
}

/// Why a row did not go out, by whose fault it is.
#[derive(Debug)]
pub(super) enum Miss {
    /// The message itself (too large, invalid): lands FAILED.
    Message(Reason, String),
    /// The world (unreachable, full, too slow): its batch goes again.
    World(Reason, String),
}

impl From<Miss> for Outcome {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::Message(reason, error) => Outcome::Refused(reason, error),
            Miss::World(reason, error) => Outcome::Deferred(reason, error),
        }
    }
}

/// Classifies a producer or broker error: the class decides whether the
/// row lands FAILED, the reason only labels the metric.
pub(super) fn classify(error: &KafkaError) -> Miss {
    let code = error.rdkafka_error_code();
    let reason = if is_refused_access(error) {
        // Credentials or rights refused: the alert's counter, shared with
        // the worker's consumer; never the fault of the record.
        metrics::counter!("flotilla_kafka_access_refused_total").increment(1);
        Reason::RefusedAccess
    } else {
        code.map_or(Reason::Other, Reason::of)
    };
    match code {
        Some(code) if is_refused_for_itself(code) => Miss::Message(reason, error.to_string()),
        _ => Miss::World(reason, error.to_string()),
    }
}

/// Classifies an encoding error: the registry unavailable, refusing the
/// event schema (409, 422: the schema is the relay's, the same for every
/// event, so an operator must fix the subject's compatibility) or
/// misconfigured is the world's fault and its batch goes again; an event that
/// breaks a rule is the message's.
pub(super) fn classify_encoding(error: &CodecError) -> Miss {
    let text = format!("encoding: {error}");
    match error {
        e if e.is_transient() => Miss::World(Reason::Registry, text),
        CodecError::RegistryRefused { .. } | CodecError::Settings(_) => {
            metrics::counter!("flotilla_relay_schema_refused_total").increment(1);
            Miss::World(Reason::Registry, text)
        }
        _ => Miss::Message(Reason::Invalid, text),
    }
}

/// How one row's send ended.
#[derive(Debug)]
pub enum Outcome {
    /// The broker has it.
    Acked,
    /// Refused for itself: lands FAILED.
    Refused(Reason, String),
    /// Held back by the world: nothing is written for it.
    Deferred(Reason, String),
    /// Its payload does not decode: it can never be published as it is.
    Unreadable(String),
}

impl Outcome {
    /// Held back by the world: its batch goes again.
    #[must_use]
    pub fn is_deferred(&self) -> bool {
        matches!(self, Self::Deferred(..))
    }
}
