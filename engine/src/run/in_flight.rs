//! The jobs this process is running now, by lease token: what a shutdown
//! whose grace ran out hands back in one statement (`lifecycle.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

/// Jobs in a segment on this process, with the token each is leased under.
#[derive(Debug, Clone, Default)]
pub(crate) struct InFlight(Arc<Mutex<HashMap<Uuid, Uuid>>>);

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Uuid>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `job_id` as running under `token` until the guard is dropped.
    pub(crate) fn enter(&self, job_id: Uuid, token: Uuid) -> Entered {
        self.lock().insert(job_id, token);
        Entered {
            registry: self.clone(),
            job_id,
            token,
        }
    }

    /// Every job running now, with its token.
    pub(crate) fn held(&self) -> Vec<(Uuid, Uuid)> {
        self.lock()
            .iter()
            .map(|(job, token)| (*job, *token))
            .collect()
    }
}

/// One job's entry; removed when its segment ends, however it ends.
#[derive(Debug)]
pub(crate) struct Entered {
    registry: InFlight,
    job_id: Uuid,
    token: Uuid,
}

impl Drop for Entered {
    fn drop(&mut self) {
        // Only its own entry: a stale segment of a job this process claimed
        // again under a new token must not remove the new one.
        let mut held = self.registry.lock();
        if held.get(&self.job_id) == Some(&self.token) {
            held.remove(&self.job_id);
        }
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

    /// A stale segment of a job claimed again under a new token ends after
    /// the new one began: the new entry stays.
    #[test]
    fn a_stale_segment_does_not_remove_the_jobs_new_entry() {
        let in_flight = InFlight::default();
        let job = Uuid::new_v4();
        let (stale, fresh) = (Uuid::new_v4(), Uuid::new_v4());
        let old = in_flight.enter(job, stale);
        let new = in_flight.enter(job, fresh);
        drop(old);
        assert_eq!(in_flight.held(), [(job, fresh)]);
        drop(new);
        assert!(in_flight.held().is_empty());
    }
}
