//! The jobs this process is running now, by lease token: what a shutdown
//! whose grace ran out hands back in one statement (`runner.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

/// Jobs in a segment on this process, with the token each is leased under.
#[derive(Debug, Clone, Default)]
pub(super) struct InFlight(Arc<Mutex<HashMap<Uuid, Uuid>>>);

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Uuid>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `job_id` as running under `token` until the guard is dropped.
    pub(super) fn enter(&self, job_id: Uuid, token: Uuid) -> Entered {
        self.lock().insert(job_id, token);
        Entered {
            registry: self.clone(),
            job_id,
        }
    }

    /// Every job running now, with its token.
    pub(super) fn held(&self) -> Vec<(Uuid, Uuid)> {
        self.lock()
            .iter()
            .map(|(job, token)| (*job, *token))
            .collect()
    }
}

/// One job's entry; removed when its segment ends, however it ends.
#[derive(Debug)]
pub(super) struct Entered {
    registry: InFlight,
    job_id: Uuid,
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.job_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_is_held_until_its_entry_is_dropped() {
        let in_flight = InFlight::default();
        let (job, token) = (Uuid::new_v4(), Uuid::new_v4());
        let entry = in_flight.enter(job, token);
        assert_eq!(in_flight.held(), [(job, token)]);
        drop(entry);
        assert!(in_flight.held().is_empty());
    }
}
