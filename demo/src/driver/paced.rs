//! One job at a time: the latency a person sees who submits a job to an
//! idle fleet. The burst before it measures throughput; its latencies are
//! mostly queueing (the last of 300 requests produced at once waits for the
//! 299 before it). Here each straight-through job is produced only once the
//! previous one's COMPLETED event was read back, and timed by stage.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context as _, bail};
use chrono::Utc;
use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunEvent, WorkflowRunEventType, WorkflowRunRequest};
use futures_util::StreamExt as _;
use rdkafka::Message as _;

use rdkafka::producer::FutureRecord;
use uuid::Uuid;

use super::report::Stages;
use super::samples::Kind;
use super::{DriverSettings, Events, ready_producer};

/// Straight-through jobs timed one at a time.
pub const JOBS: usize = 20;

/// Runs [`JOBS`] straight-through jobs one after another (after one more,
/// untimed, that brings this reader up to the topic's end) and returns
/// their stages.
///
/// # Errors
/// The broker or the registry fails, a job ends otherwise than COMPLETED,
/// or `deadline` passes.
pub async fn run(settings: &DriverSettings, deadline: Instant) -> anyhow::Result<Stages> {
    let codec = Codec::from_config(&settings.broker.registry)?;
    let producer = ready_producer(settings).await?;
    let consumer = super::event_reader(settings).await?;
    let mut stream = consumer.stream();
    let mut events = Events::default();
    let mut produced = HashMap::new();
    for n in 0..=JOBS {
        let request = WorkflowRunRequest::new(
            Uuid::new_v4(),
            Kind::Shipping.workflow(),
            Kind::Shipping.input(10_000 + n),
        )?;
        let job_id = request.job_id();
        let payload = codec.encode(&settings.request_topic, &request).await?;
        let key = job_id.to_string();
        let produced_at = Utc::now();
        producer
            .send_result(
                FutureRecord::to(&settings.request_topic)
                    .key(&key)
                    .payload(&payload),
            )
            .map_err(|(e, _)| anyhow::anyhow!("producing: {e}"))?
            .await
            .context("the producer went away")?
            .map_err(|(e, _)| anyhow::anyhow!("a request was not delivered: {e}"))?;
        if n > 0 {
            produced.insert(job_id, produced_at);
        }
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let Ok(Some(message)) = tokio::time::timeout(remaining, stream.next()).await else {
                bail!(
                    "job {job_id} of the one-at-a-time sample had no COMPLETED event by the deadline"
                );
            };
            let Some(payload) = message?.payload().map(<[u8]>::to_vec) else {
                continue;
            };
            let event: WorkflowRunEvent = codec.decode(&payload).await?;
            if event.job_id() != job_id {
                continue;
            }
            match event.event_type() {
                WorkflowRunEventType::Accepted => {
                    events.accepted_at.insert(job_id, event.occurred_at());
                }
                WorkflowRunEventType::Completed => {
                    events.completed_at.insert(job_id, event.occurred_at());
                    events.completed_read_at.insert(job_id, Utc::now());
                    break;
                }
                WorkflowRunEventType::StepCheckpoint => {}
                other => bail!("job {job_id} of the one-at-a-time sample ended {other:?}"),
            }
        }
    }
    // librdkafka can block in a client's destructor: not on the runtime.
    drop(stream);
    std::thread::spawn(move || drop((producer, consumer)));
    let mut stages = Stages::default();
    for (job_id, produced_at) in produced {
        stages.add(produced_at, job_id, &events);
    }
    stages.sort();
    Ok(stages)
}
