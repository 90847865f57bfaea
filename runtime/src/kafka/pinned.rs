//! Properties Flotilla sets on its Kafka clients for its guarantees, which
//! no pass-through property may reach, and librdkafka's alias names, which
//! would otherwise reach them.
//!
//! librdkafka accepts several names for some properties (`acks` and
//! `request.required.acks`); a client configuration is a map, applied in
//! no fixed order, so two spellings of one property made the winner random
//! per start. Every key is therefore read as the property it names
//! ([`canonical`]) before anything is applied.

/// Each alias librdkafka accepts, with the property it sets.
const ALIASES: &[(&str, &str)] = &[
    ("bootstrap.servers", "metadata.broker.list"),
    ("max.in.flight", "max.in.flight.requests.per.connection"),
    ("sasl.mechanism", "sasl.mechanisms"),
    (
        "sasl.oauthbearer.client.credentials.client.id",
        "sasl.oauthbearer.client.id",
    ),
    (
        "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.client.secret",
    ),
    ("max.partition.fetch.bytes", "fetch.message.max.bytes"),
    ("linger.ms", "queue.buffering.max.ms"),
    ("retries", "message.send.max.retries"),
    ("compression.type", "compression.codec"),
    ("acks", "request.required.acks"),
    ("delivery.timeout.ms", "message.timeout.ms"),
    ("auto.commit.enable", "enable.auto.commit"),
];

/// The property `key` sets, whichever of its names it is.
#[must_use]
pub fn canonical(key: &str) -> &str {
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == key)
        .map_or(key, |(_, property)| property)
}

/// Properties Flotilla sets itself, and why a pass-through may not.
pub const PINNED: &[(&str, &str)] = &[
    (
        "metadata.broker.list",
        "the broker list is KAFKA_BOOTSTRAP_SERVERS",
    ),
    (
        "enable.idempotence",
        "the producers are idempotent (the relay's unless FLOTILLA_RELAY_IDEMPOTENCE=false)",
    ),
    (
        "request.required.acks",
        "every record waits for all in-sync replicas",
    ),
    (
        "message.timeout.ms",
        "the relay's send window and the dead-letter timeout are derived from the lease",
    ),
    (
        "partitioner",
        "a job's records must keep landing in the partition its key maps to",
    ),
    ("isolation.level", "consumers read only committed records"),
    ("group.id", "the group is FLOTILLA_CONSUMER_GROUP"),
    (
        "group.protocol",
        "the consumer group protocol is FLOTILLA_GROUP_PROTOCOL (EventStreamOptions::group_protocol in the client library)",
    ),
    (
        "group.instance.id",
        "static membership is FLOTILLA_STATIC_MEMBERSHIP, keyed on the worker id",
    ),
    (
        "enable.auto.commit",
        "offsets are committed only after the rows they produced (the request consumer's timer commits only offsets stored after their rows)",
    ),
    (
        "enable.auto.offset.store",
        "offsets are stored only after the rows they produced",
    ),
    (
        "transactional.id",
        "Flotilla's producers are not transactional",
    ),
];

/// The partitioner every producer uses (librdkafka's default, named so no
/// property can change it): a key's records always land in one partition.
pub const PARTITIONER: &str = "consistent_random";
/// What consumers read: committed records only.
pub const ISOLATION_LEVEL: &str = "read_committed";

/// Why `key`, given as a pass-through property, is refused; `None` when it
/// may be set.
#[must_use]
pub fn refusal(key: &str) -> Option<String> {
    let property = canonical(key);
    let (_, why) = PINNED.iter().find(|(pinned, _)| *pinned == property)?;
    let named = if property == key {
        String::new()
    } else {
        format!(" (an alias of {property})")
    };
    Some(format!(
        "{key}{named} is set by Flotilla and cannot be overridden: {why}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pinned_property_and_its_aliases_are_refused_by_name() {
        for key in [
            "acks",
            "request.required.acks",
            "delivery.timeout.ms",
            "message.timeout.ms",
            "enable.idempotence",
            "partitioner",
            "isolation.level",
            "auto.commit.enable",
            "enable.auto.commit",
            "group.instance.id",
            "bootstrap.servers",
        ] {
            let refused = refusal(key).unwrap_or_else(|| panic!("{key} is pinned"));
            assert!(refused.starts_with(key), "{refused}");
        }
        assert!(
            refusal("acks")
                .unwrap()
                .contains("an alias of request.required.acks")
        );
        for free in [
            "client.rack",
            "linger.ms",
            "sasl.mechanism",
            "session.timeout.ms",
        ] {
            assert_eq!(refusal(free), None, "{free}");
        }
    }

    #[test]
    fn aliases_read_as_the_property_they_set() {
        assert_eq!(canonical("acks"), "request.required.acks");
        assert_eq!(canonical("sasl.mechanism"), "sasl.mechanisms");
        assert_eq!(canonical("sasl.mechanisms"), "sasl.mechanisms");
        assert_eq!(canonical("client.rack"), "client.rack");
    }
}
