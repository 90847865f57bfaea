//! The jobs' ends read from the event topic, for
//! [`Submitter::submit_and_wait`](crate::Submitter::submit_and_wait)
//! through Kafka.
//!
//! One reader per submitter, started by the first wait: a consumer assigned
//! every partition of the event topic at its end as it was then (no
//! consumer group, nothing committed), so it sees every event published
//! after, and hands each terminal event of a job someone waits on to its
//! waiters. A wait registers before its request is produced, so the end
//! cannot be published before the reader looks for it. Partitions added to
//! the topic later are not read (the fleet places events by the partition
//! count it recorded, which an operator changes only with care).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunEvent, WorkflowRunEventType, topics};
use flotilla_runtime::BrokerConfig;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use tokio::sync::{OnceCell, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use crate::outcome::{Ended, WaitError};
use crate::submit_error::SubmitError;

/// How long the topic's partitions and ends may take to learn.
const METADATA_WAIT: Duration = Duration::from_secs(10);

type Waiters = Arc<Mutex<HashMap<Uuid, Vec<oneshot::Sender<Ended>>>>>;

/// Where the ends are read from, and the reader once started.
pub(crate) struct EndsFeed {
    broker: BrokerConfig,
    topic: String,
    reader: OnceCell<Reader>,
}

struct Reader {
    waiters: Waiters,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One job's end, to come.
pub(crate) struct Watch {
    job_id: Uuid,
    end: oneshot::Receiver<Ended>,
}

impl EndsFeed {
    pub(crate) fn new(broker: BrokerConfig) -> Self {
        Self {
            broker,
            topic: topics::EVENT_TOPIC.to_owned(),
            reader: OnceCell::new(),
        }
    }

    pub(crate) fn set_topic(&mut self, topic: &str) {
        topic.clone_into(&mut self.topic);
    }

    /// Watches for `job_id`'s end from now on, starting the reader first.
    ///
    /// # Errors
    /// The event topic's partitions cannot be learnt (unavailable), or no
    /// consumer can be made (settings).
    pub(crate) async fn watch(&self, job_id: Uuid) -> Result<Watch, SubmitError> {
        let reader = self
            .reader
            .get_or_try_init(|| Reader::start(&self.broker, &self.topic))
            .await?;
        let (sender, end) = oneshot::channel();
        reader
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(job_id)
            .or_default()
            .push(sender);
        Ok(Watch { job_id, end })
    }
}

impl Watch {
    /// The job's end, or [`WaitError::TimedOut`] once `deadline` passes.
    pub(crate) async fn ended(self, deadline: Instant) -> Result<Ended, WaitError> {
        let job_id = self.job_id;
        match tokio::time::timeout_at(deadline, self.end).await {
            Ok(Ok(ended)) => Ok(ended),
            Ok(Err(_)) => Err(WaitError::TimedOut {
                job_id,
                last_error: Some("the event reader stopped".to_owned()),
            }),
            Err(_) => Err(WaitError::TimedOut {
                job_id,
                last_error: None,
            }),
        }
    }
}

impl Reader {
    async fn start(broker: &BrokerConfig, topic: &str) -> Result<Self, SubmitError> {
        let codec = Codec::from_config(&broker.registry)?;
        let consumer: StreamConsumer = broker
            .manual_commit_consumer(&format!("flotilla-client-ends-{}", Uuid::new_v4()))
            .create()
            .map_err(|e| SubmitError::Settings(format!("creating the event reader: {e}")))?;
        let consumer = Arc::new(consumer);
        let assigned = {
            let (consumer, topic) = (consumer.clone(), topic.to_owned());
            tokio::task::spawn_blocking(move || assign_at_the_end(&consumer, &topic))
                .await
                .map_err(|e| SubmitError::Unavailable(format!("the event reader: {e}")))?
        };
        assigned?;
        let waiters = Waiters::default();
        let task = tokio::spawn(read(consumer, codec, waiters.clone()));
        Ok(Self { waiters, task })
    }
}

/// Assigns every partition of `topic` at its high watermark (blocking).
fn assign_at_the_end(consumer: &StreamConsumer, topic: &str) -> Result<(), SubmitError> {
    let unavailable = |e: rdkafka::error::KafkaError| {
        SubmitError::Unavailable(format!("reading the ends of {topic}: {e}"))
    };
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_WAIT)
        .map_err(unavailable)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(SubmitError::Unavailable(format!(
            "the event topic {topic} has no partitions the broker shows"
        )));
    }
    let mut assignment = TopicPartitionList::new();
    for partition in partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, partition, METADATA_WAIT)
            .map_err(unavailable)?;
        assignment
            .add_partition_offset(topic, partition, Offset::Offset(high))
            .map_err(unavailable)?;
    }
    consumer.assign(&assignment).map_err(unavailable)
}

/// Hands each terminal event of a job waited on to its waiters. A record
/// that is no event, or an outage, is logged and read past: a wait then
/// runs out rather than fail on another job's record.
async fn read(consumer: Arc<StreamConsumer>, codec: Codec, waiters: Waiters) {
    loop {
        let message = match consumer.recv().await {
            Ok(message) => message,
            Err(e) => {
                tracing::warn!(error = %e, "reading the event topic for waits");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let Some(payload) = message.payload() else {
            continue;
        };
        let event = match codec.decode::<WorkflowRunEvent>(payload).await {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(error = %e, partition = message.partition(), offset = message.offset(),
                    "a record on the event topic is no event");
                continue;
            }
        };
        let Some(ended) = end_of(&event) else {
            continue;
        };
        let taken = waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&event.job_id());
        for waiter in taken.into_iter().flatten() {
            // A waiter that gave up has dropped its receiver: nothing to do.
            let _ = waiter.send(ended.clone());
        }
    }
}

/// The end a terminal event states.
fn end_of(event: &WorkflowRunEvent) -> Option<Ended> {
    let error = || event.error().unwrap_or_default().to_owned();
    Some(match event.event_type() {
        WorkflowRunEventType::Completed => {
            Ended::Completed(event.result().cloned().unwrap_or(serde_json::Value::Null))
        }
        WorkflowRunEventType::Failed => Ended::Failed(error()),
        WorkflowRunEventType::Dead => Ended::Dead(error()),
        WorkflowRunEventType::Cancelled => Ended::Cancelled(error()),
        _ => return None,
    })
}
