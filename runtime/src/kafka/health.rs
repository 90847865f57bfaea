//! What a consumer (of requests, or of replies) says about itself, read by
//! readiness and the metrics without asking the broker anything: whether
//! it is riding out an outage (since when, and why).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The consumer's own state, shared with the API.
#[derive(Debug, Default)]
pub struct ConsumerHealth {
    /// The consumer's group: the label of its outage gauge, so the request
    /// and reply consumers of one process do not overwrite each other's.
    group: String,
    outage: Mutex<Option<(Instant, String)>>,
}

impl ConsumerHealth {
    /// The state of the consumer of `group`.
    #[must_use]
    pub fn of_group(group: &str) -> Self {
        Self {
            group: group.to_owned(),
            outage: Mutex::default(),
        }
    }

    fn outage_gauge(&self) -> metrics::Gauge {
        metrics::gauge!("flotilla_consumer_outage_seconds", "group" => self.group.clone())
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        self.outage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A batch could not be persisted for `reason`: the partitions are
    /// paused (since the first such failure of this outage).
    pub fn paused(&self, reason: String) {
        let mut outage = self.outage();
        let since = outage
            .as_ref()
            .map_or_else(Instant::now, |(since, _)| *since);
        self.outage_gauge().set(since.elapsed().as_secs_f64());
        *outage = Some((since, reason));
    }

    /// The outage is over: the partitions consume again.
    pub fn resumed(&self) {
        self.outage_gauge().set(0.0);
        *self.outage() = None;
    }

    /// How long the partitions have been paused, and the last reason.
    #[must_use]
    pub fn paused_for(&self) -> Option<(Duration, String)> {
        self.outage()
            .as_ref()
            .map(|(since, reason)| (since.elapsed(), reason.clone()))
    }
}
