//! Jobs held by their concurrency key whose slot came free without a wake:
//! a holder cancelled while it waited, settled by an operator, or whose
//! worker went away between its end and its wake. Each sweep wakes them.

use flotilla_store::StoreError;
use flotilla_store::runs::concurrency;

use crate::Engine;

impl Engine {
    /// Wakes the held jobs of up to `sweep_batch` keys with a free slot.
    /// Returns how many jobs it woke.
    ///
    /// # Errors
    /// The database failed.
    pub async fn wake_held(&self) -> Result<u64, StoreError> {
        let now = self.now();
        let batch = self.settings().sweep_batch;
        let mut woken = 0;
        for key in concurrency::keys_to_wake(self.pool(), now, batch).await? {
            woken += concurrency::wake(self.pool(), &key, now).await?;
        }
        if woken > 0 {
            tracing::debug!(
                jobs = woken,
                "jobs held by their concurrency keys woken by the sweep"
            );
            self.wake();
        }
        Ok(woken)
    }
}
