//! `flotilla-runtime`: what every Flotilla binary shares. The broker
//! settings and the one configuration of each Kafka client ([`kafka`]), the
//! registry's settings ([`registry`]), TLS for HTTP clients ([`tls`]),
//! logging ([`telemetry`]), the shutdown signal ([`shutdown`]), backoff
//! ([`backoff`]) and the host's identity ([`identity`]). No database: the
//! command-line client uses this crate too.

pub mod backoff;
pub mod identity;
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

pub use kafka::BrokerConfig;
