//! The sweeper's share of the cancel cascade: children of parents that
//! ended still unfinished, cancelled now (`ops/children.rs` cancels them
//! when their parent ends on this worker).

use flotilla_store::runs::children;

use crate::ops::children::cascade_reason;
use crate::{Engine, OperatorError};

/// Children the cancel cascade handles in one sweeper pass.
const CASCADE_BATCH: i64 = 64;

impl Engine {
    /// The sweeper's share of the cascade: children of parents that ended
    /// (cancelled, failed, dead) still unfinished (their parent's worker
    /// was gone, the parent was ended by the sweeper, or the first cascade
    /// failed), cancelled now. A child its cancel fails for is logged and
    /// passed: one row does not hold the rest back.
    pub(crate) async fn cascade_cancels(&self) -> Result<usize, OperatorError> {
        let orphans = flotilla_store::sql::session(self.pool(), async |conn| {
            children::orphaned_by_cancel(conn, CASCADE_BATCH).await
        })
        .await?;
        let mut cancelled = 0;
        for (child, parent, ended) in orphans {
            let reason = cascade_reason(parent, Some(ended));
            match self.cancel(child, &reason).await {
                Ok(_) => cancelled += 1,
                Err(OperatorError::WrongState { .. }) => {}
                Err(OperatorError::Store(e)) if !e.is_about_the_data() => {
                    return Err(OperatorError::Store(e));
                }
                Err(e) => {
                    tracing::warn!(%child, %parent, error = %e, "the cascade could not cancel this child; passing it");
                }
            }
        }
        Ok(cancelled)
    }
}
