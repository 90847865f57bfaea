//! Waiting for a permit of a rate-limited target (the store spaces the
//! fleet's permits: `store/src/target_rates.rs`). A wait that fits in what is
//! left of the segment is slept here, the lease renewed meanwhile by its
//! heartbeat; a longer one hands the job back until the permit frees, its
//! attempt given back: a limit of the fleet's is no failure of the job.

use std::time::Duration;

use chrono::{DateTime, Utc};
use flotilla_store::StoreError;
use flotilla_store::target_rates::{self, Permit};
use flotilla_targets::RateLimit;
use tokio_util::sync::CancellationToken;

use crate::Engine;

/// Why no permit was taken.
#[derive(Debug)]
pub(crate) enum NoPermit {
    /// The next permit frees after what is left of the segment: hand the
    /// job back until `until`, saying `reason`.
    Later {
        until: DateTime<Utc>,
        reason: String,
    },
    LeaseLost,
    Store(StoreError),
}

/// What is kept back from the segment's time for the call itself.
const CALL_MARGIN: Duration = Duration::from_millis(100);

impl Engine {
    /// Takes a permit for a call to `target` (limited to `rate`), waiting
    /// for one while it frees within `left`. Returns how long it waited.
    pub(crate) async fn rate_permit(
        &self,
        target: &str,
        rate: RateLimit,
        left: Duration,
        lease_lost: &CancellationToken,
    ) -> Result<Duration, NoPermit> {
        let began = tokio::time::Instant::now();
        loop {
            let now = self.now();
            let permit = target_rates::take(self.pool(), target, (rate.calls, rate.period), now)
                .await
                .map_err(NoPermit::Store)?;
            let free_at = match permit {
                Permit::Granted => return Ok(began.elapsed()),
                Permit::FreeAt(at) => at,
            };
            metrics::counter!("flotilla_target_rate_waits_total", "target" => target.to_owned())
                .increment(1);
            let wait = (free_at - now).to_std().unwrap_or_default();
            if began.elapsed() + wait + CALL_MARGIN > left {
                return Err(NoPermit::Later {
                    until: free_at,
                    reason: format!(
                        "held by the rate limit of target {target} ({rate}): its next call may begin at {}",
                        free_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                    ),
                });
            }
            // Another worker may take the permit first: asked again then.
            tokio::select! {
                () = tokio::time::sleep(wait.max(Duration::from_millis(1))) => {}
                () = lease_lost.cancelled() => return Err(NoPermit::LeaseLost),
            }
        }
    }
}
