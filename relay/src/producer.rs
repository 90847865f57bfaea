//! The relay's Kafka producer, replaced when it dies.
//!
//! An idempotent producer enters a fatal state when the broker refuses its
//! sequence for good (it lost records the producer counted as written, or
//! forgot the producer id): every later send fails. The relay then builds
//! a new one from the same settings before its next round, so publishing
//! goes on (a record that failed is sent again by the round that follows,
//! as after any refusal of the world), and says so in a log line and a
//! metric.

use std::sync::{Arc, RwLock};

use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, Producer as _};

/// The current producer and how to make another; clones share both.
#[derive(Clone)]
pub struct Producer {
    config: ClientConfig,
    current: Arc<RwLock<FutureProducer>>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").finish_non_exhaustive()
    }
}

impl Producer {
    /// Wraps `producer`, made from `config`.
    #[must_use]
    pub fn new(config: ClientConfig, producer: FutureProducer) -> Self {
        Self {
            config,
            current: Arc::new(RwLock::new(producer)),
        }
    }

    /// The producer to send with now.
    pub fn current(&self) -> FutureProducer {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the producer when it is in a fatal state; whether it did.
    /// A producer that cannot be made is logged and kept: the next round
    /// tries again.
    pub fn replace_if_fatal(&self) -> bool {
        let Some((code, reason)) = self.current().client().fatal_error() else {
            return false;
        };
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                tracing::warn!(?code, reason, "the producer hit a fatal error; replaced it");
                metrics::counter!("flotilla_relay_producer_replaced_total").increment(1);
                *self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
                true
            }
            Err(e) => {
                tracing::error!(?code, reason, error = %e, "the producer hit a fatal error and another could not be made");
                false
            }
        }
    }
}
