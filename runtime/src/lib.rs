//! `flotilla-runtime`: what every Flotilla binary shares. The broker
//! settings and the one configuration of each Kafka client ([`kafka`]), the
//! registry's settings ([`registry`]), TLS for HTTP clients ([`tls`]),
//! logging ([`telemetry`]), the shutdown signal ([`shutdown`]), backoff
//! ([`backoff`]) and the host's identity ([`identity`]). No database: the
//! command-line client uses this crate too. Without the `kafka` feature
//! (on by default) there are no Kafka settings or clients, and librdkafka
//! is not built: the client crate's API-only build.

pub mod backoff;
pub mod identity;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod metrics;
pub mod redact;
pub mod registry;
pub mod settings;
pub mod shutdown;
pub mod supervise;
pub mod telemetry;
pub mod tls;
pub mod trace;

#[cfg(feature = "kafka")]
pub use kafka::BrokerConfig;
