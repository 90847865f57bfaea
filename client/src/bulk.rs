//! [`Submitter::submit_all`]: many submissions in flight at once.
//!
//! Through Kafka every record is handed to the producer before any
//! acknowledgement is awaited, so librdkafka batches them (one flush for
//! the lot, not a round trip each); the first goes alone, so the registry
//! is asked for the schema once, not once per record. Through the API a
//! bounded number of requests are in flight.

use futures_util::StreamExt as _;

use crate::submit::Route;
use crate::{Receipt, Submission, SubmitError, Submitter};

/// Requests in flight at once through the API.
const API_IN_FLIGHT: usize = 16;

impl Submitter {
    /// Submits every one of `submissions`, many at once, and returns each
    /// one's outcome in their order: a receipt once it is durable, or its
    /// error, classed as [`Submitter::submit`] classes it. One refused
    /// submission does not stop the others; retry the
    /// [retryable](SubmitError::is_retryable) ones with the same job ids.
    pub async fn submit_all(
        &self,
        submissions: &[Submission],
    ) -> Vec<Result<Receipt, SubmitError>> {
        match &self.route {
            #[cfg(feature = "kafka")]
            Route::Kafka(_) => {
                let Some((first, rest)) = submissions.split_first() else {
                    return Vec::new();
                };
                let mut outcomes = vec![self.submit(first).await];
                let others = rest.iter().map(|s| self.submit(s));
                outcomes.extend(futures_util::future::join_all(others).await);
                outcomes
            }
            Route::Api { .. } => {
                futures_util::stream::iter(submissions)
                    .map(|s| self.submit(s))
                    .buffered(API_IN_FLIGHT)
                    .collect()
                    .await
            }
        }
    }
}
