//! `/v1/fleet`: the whole fleet at a glance, for the console. The database
//! part is one snapshot; the consumer lag is asked of the broker, and a
//! broker that does not answer is reported in the document, not as an error
//! of the whole view.

use std::time::Duration;

use axum::extract::State;
use serde::Serialize;

use crate::ApiState;
use crate::problem::{Problem, ProblemDoc};
use flotilla_engine::FleetSnapshot;
use flotilla_runtime::kafka::lag::PartitionLag;

/// How long the broker may take to answer each lag request.
const LAG_TIMEOUT: Duration = Duration::from_secs(2);

/// The request consumers' position, or why it is unknown.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ConsumerLag {
    group: Option<String>,
    topic: Option<String>,
    #[schema(value_type = Vec<Object>)]
    partitions: Vec<PartitionLag>,
    error: Option<String>,
}

/// The fleet view.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct FleetView {
    #[serde(flatten)]
    #[schema(value_type = Object)]
    snapshot: FleetSnapshot,
    consumer_lag: ConsumerLag,
}

#[utoipa::path(get, path = "/v1/fleet", responses((status = 200, description = "workers, relays, outbox backlog, consumer lag, dead letters by reason, jobs finished per minute over the last hour", body = FleetView), (status = 503, description = "database unavailable", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn fleet(State(state): State<ApiState>) -> Result<axum::Json<FleetView>, Problem> {
    let snapshot = state.engine.fleet().await?;
    let consumer_lag = match &state.lag {
        None => ConsumerLag {
            group: None,
            topic: None,
            partitions: Vec::new(),
            error: Some("this worker does not consume requests".into()),
        },
        Some(source) => {
            let (partitions, error) = match source.read(LAG_TIMEOUT).await {
                Ok(partitions) => (partitions, None),
                Err(e) => (Vec::new(), Some(format!("the broker did not answer: {e}"))),
            };
            ConsumerLag {
                group: Some(source.source().group.clone()),
                topic: Some(source.source().topic.clone()),
                partitions,
                error,
            }
        }
    };
    Ok(axum::Json(FleetView {
        snapshot,
        consumer_lag,
    }))
}
