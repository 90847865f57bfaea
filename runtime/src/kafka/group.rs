//! The two consumer group protocols a Kafka 4 broker speaks, and what each
//! lets a member set.
//!
//! Under the *classic* protocol the members elect a leader that assigns
//! partitions (Flotilla asks for the cooperative-sticky assignor, so a
//! rebalance moves only the partitions that change hands) and each member
//! sets its own session timeout. Under the *consumer* protocol (KIP-848,
//! Kafka 4.0 and later) the broker assigns partitions and owns the session
//! timeout and heartbeat interval (`group.consumer.session.timeout.ms`,
//! `group.consumer.heartbeat.interval.ms`, or per group through the admin
//! API): librdkafka refuses a client that sets them, so Flotilla refuses
//! them first, by name, before any client exists.

use std::time::Duration;

use rdkafka::ClientConfig;

use super::pinned::canonical;
use super::security::{KafkaSecurity, SecurityError};

/// The consumer group protocol a consumer joins its group with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum GroupProtocol {
    /// Client-side assignment (cooperative-sticky), the member's own
    /// session timeout; every Kafka broker speaks it.
    #[default]
    Classic,
    /// Broker-side assignment (KIP-848); needs Kafka 4.0 or later (or a
    /// managed service that enables it).
    Consumer,
}

/// Properties the broker owns under the consumer protocol.
const BROKER_OWNED: &[&str] = &[
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "group.protocol.type",
];

impl GroupProtocol {
    /// librdkafka's name for it (`group.protocol`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Consumer => "consumer",
        }
    }

    /// Sets the protocol on a consumer's `config`, and what goes with it:
    /// the cooperative assignor under the classic protocol; `max_poll` as
    /// `max.poll.interval.ms` under both, and as the session timeout too
    /// under the classic one (librdkafka wants the session within the poll
    /// interval; under the consumer protocol the broker sets the session).
    pub fn configure(self, config: &mut ClientConfig, max_poll: Option<Duration>) {
        config.set("group.protocol", self.as_str());
        if self == Self::Classic {
            config.set("partition.assignment.strategy", "cooperative-sticky");
        }
        if let Some(interval) = max_poll {
            let millis = interval.as_millis().to_string();
            config.set("max.poll.interval.ms", &millis);
            if self == Self::Classic {
                config.set("session.timeout.ms", &millis);
            }
        }
    }

    /// Refuses a pass-through property this protocol leaves to the broker,
    /// naming it and where it is set instead.
    ///
    /// # Errors
    /// The first such property.
    pub fn check(self, security: &KafkaSecurity) -> Result<(), SecurityError> {
        if self == Self::Classic {
            return Ok(());
        }
        let refused = security
            .pass_through_keys()
            .map(canonical)
            .find(|key| BROKER_OWNED.contains(key));
        match refused {
            Some(key) => Err(SecurityError {
                setting: "Kafka properties",
                problem: format!(
                    "{key} is not a client setting under the consumer group protocol \
                     (FLOTILLA_GROUP_PROTOCOL=consumer): the broker owns it (set \
                     group.consumer.session.timeout.ms or group.consumer.heartbeat.interval.ms \
                     on the brokers, or per group), and assigns partitions itself \
                     (group.remote.assignor picks its assignor)"
                ),
            }),
            None => Ok(()),
        }
    }
}

impl std::fmt::Display for GroupProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured(protocol: GroupProtocol, max_poll: Option<Duration>) -> ClientConfig {
        let mut config = ClientConfig::new();
        protocol.configure(&mut config, max_poll);
        config
    }

    #[test]
    fn the_classic_protocol_asks_for_the_cooperative_assignor_and_its_own_session() {
        let config = configured(GroupProtocol::Classic, Some(Duration::from_secs(7)));
        assert_eq!(config.get("group.protocol"), Some("classic"));
        assert_eq!(
            config.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(config.get("session.timeout.ms"), Some("7000"));
        assert_eq!(config.get("max.poll.interval.ms"), Some("7000"));
    }

    #[test]
    fn the_consumer_protocol_leaves_assignment_and_session_to_the_broker() {
        let config = configured(GroupProtocol::Consumer, Some(Duration::from_secs(7)));
        assert_eq!(config.get("group.protocol"), Some("consumer"));
        assert_eq!(config.get("partition.assignment.strategy"), None);
        assert_eq!(config.get("session.timeout.ms"), None);
        assert_eq!(config.get("max.poll.interval.ms"), Some("7000"));
    }

    #[test]
    fn a_consumer_made_for_either_protocol_is_accepted_by_librdkafka() {
        for protocol in [GroupProtocol::Classic, GroupProtocol::Consumer] {
            let mut config = configured(protocol, Some(Duration::from_secs(60)));
            config
                .set("bootstrap.servers", "127.0.0.1:9")
                .set("group.id", "g");
            let created: Result<rdkafka::consumer::BaseConsumer, _> = config.create();
            assert!(created.is_ok(), "{protocol}: {:?}", created.err());
        }
    }

    #[test]
    fn broker_owned_properties_are_refused_by_name_under_the_consumer_protocol() {
        for key in BROKER_OWNED {
            let security = KafkaSecurity {
                kafka_property: vec![((*key).to_owned(), "10000".to_owned())],
                ..KafkaSecurity::default()
            };
            let refused = GroupProtocol::Consumer.check(&security).unwrap_err();
            assert!(refused.problem.starts_with(key), "{}", refused.problem);
            assert!(GroupProtocol::Classic.check(&security).is_ok());
        }
        let assignor = KafkaSecurity {
            kafka_property: vec![("group.remote.assignor".to_owned(), "range".to_owned())],
            ..KafkaSecurity::default()
        };
        assert!(GroupProtocol::Consumer.check(&assignor).is_ok());
    }
}
