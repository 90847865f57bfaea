//! The demo driver: acts as the users of a fleet would. It produces the
//! sample requests to Kafka (Avro through the registry when one is set),
//! watches every job through the HTTP API, answers the human steps (approve
//! or cancel), sends the settlement samples' signals to the signal topic, reads the lifecycle events back from the event topic, and
//! checks that every job ended where its kind says.

pub mod paced;
pub mod progress;
pub mod report;
pub mod samples;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use flotilla_codec::Codec;
use flotilla_contracts::{
    WorkflowRunEvent, WorkflowRunEventType, WorkflowRunRequest, WorkflowRunSignal,
};
use flotilla_runtime::BrokerConfig;
use futures_util::StreamExt as _;
use rdkafka::Message as _;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{Value, json};
use uuid::Uuid;

use samples::Kind;

/// What the driver needs to reach the fleet.
#[derive(Debug, Clone, clap::Args)]
pub struct DriverSettings {
    /// Requests to produce (at least 9: one of each kind).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(9..=100_000))]
    pub jobs: u32,
    /// A worker's HTTP API.
    #[arg(long, env = "FLOTILLA_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token for the API (a secret).
    #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true, value_parser = flotilla_runtime::settings::secret)]
    pub token: Option<SecretString>,
    #[command(flatten)]
    pub broker: BrokerConfig,
    /// Where requests go.
    #[arg(long, env = "FLOTILLA_REQUEST_TOPIC", default_value = flotilla_contracts::topics::REQUEST_TOPIC)]
    pub request_topic: String,
    /// Where the `settlement` samples' signals go.
    #[arg(long, env = "FLOTILLA_SIGNAL_TOPIC", default_value = flotilla_contracts::topics::SIGNAL_TOPIC)]
    pub signal_topic: String,
    /// Where the relay publishes lifecycle events.
    #[arg(long, env = "FLOTILLA_EVENT_TOPIC", default_value = flotilla_contracts::topics::EVENT_TOPIC)]
    pub event_topic: String,
    /// The whole run's deadline.
    #[arg(long, default_value = "5m")]
    pub timeout: humantime::Duration,
}

/// One sample job as the driver sees it.
#[derive(Debug, Clone)]
pub struct Tracked {
    pub kind: Kind,
    pub produced_at: DateTime<Utc>,
    /// The status the API last reported.
    pub status: String,
    /// Whether its human step was answered (approved or cancelled).
    pub answered: bool,
    /// The checkpoints the API last reported (a JSON array).
    pub checkpoints: Value,
    /// The payload of the signal it waits for, until it is sent.
    pub signal: Option<Value>,
}

/// Runs the demo; `Ok(true)` when every job ended as its kind says.
///
/// # Errors
/// The fleet cannot be reached, or the run passes its deadline.
pub async fn run(settings: DriverSettings) -> anyhow::Result<bool> {
    settings.broker.validate()?;
    let deadline = Instant::now() + *settings.timeout;
    let api = Api::new(&settings)?;
    api.wait_ready(deadline).await?;

    let (ids_sender, ids) = tokio::sync::oneshot::channel();
    let events = tokio::spawn(read_events(settings.clone(), ids, deadline));
    let started = Utc::now();
    let clock = Instant::now();
    let jobs = produce(&settings).await?;
    let produced_in = clock.elapsed();
    eprintln!(
        "demo: produced {} requests to {} in {:.1} s",
        jobs.len(),
        settings.request_topic,
        produced_in.as_secs_f64()
    );

    // The reader only ends with the run or its own error; if it is gone,
    // awaiting it below says why.
    let _ = ids_sender.send(jobs.keys().copied().collect());
    let mut jobs = jobs;
    let mut view = progress::Progress::new();
    let signaller = Signaller::new(&settings).await?;
    loop {
        api.refresh(&mut jobs).await;
        api.answer_human_steps(&mut jobs).await;
        signaller.send_due(&mut jobs).await?;
        view.draw(&jobs);
        if jobs.values().all(|job| is_terminal(&job.status)) {
            break;
        }
        if Instant::now() > deadline {
            view.finish(&jobs);
            bail!("the run passed its deadline with jobs still running");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    view.finish(&jobs);
    let finished = Utc::now();
    let events = events.await.context("the event reader stopped")??;
    let report = report::Report::new(&jobs, &events, started, finished);
    report.print();
    let one_at_a_time = paced::run(&settings, deadline).await;
    match &one_at_a_time {
        Ok(stages) => stages.print(&format!(
            "one at a time ({} straight-through jobs, each produced once the one before it was read)",
            paced::JOBS
        )),
        Err(e) => eprintln!("demo: the one-at-a-time sample failed: {e:#}"),
    }
    Ok(report.all_as_expected() && one_at_a_time.is_ok())
}

fn is_terminal(status: &str) -> bool {
    matches!(status, "COMPLETED" | "FAILED" | "DEAD" | "CANCELLED")
}

/// Says when the idempotent producer holds its producer id, from
/// librdkafka's statistics.
struct ProducerReady(tokio::sync::watch::Sender<bool>);

impl rdkafka::ClientContext for ProducerReady {
    fn stats(&self, statistics: rdkafka::Statistics) {
        if statistics
            .eos
            .is_some_and(|eos| eos.idemp_state == "Assigned")
        {
            self.0.send_replace(true);
        }
    }
}

/// An idempotent producer that already holds its producer id. A client's
/// producer is up long before it sends; the demo's is new. Its first
/// records would wait for its id (librdkafka retries that on a 500 ms timer
/// when no broker is up yet), which is not the fleet's latency: wait for
/// the id first, briefly.
async fn ready_producer(
    settings: &DriverSettings,
) -> anyhow::Result<FutureProducer<ProducerReady>> {
    let (ready, mut is_ready) = tokio::sync::watch::channel(false);
    let producer: FutureProducer<ProducerReady> = settings
        .broker
        .idempotent_producer()
        .set("queue.buffering.max.ms", "5")
        .set("statistics.interval.ms", "50")
        .create_with_context(ProducerReady(ready))
        .context("creating the producer")?;
    let _ = tokio::time::timeout(Duration::from_secs(5), is_ready.wait_for(|ready| *ready)).await;
    Ok(producer)
}

/// Sends the settlement samples' signals to the signal topic, each once its
/// job is known to the fleet (a signal for a job not ingested yet is
/// dead-lettered as `unknown_job`, as the contract says): most reach the
/// job before its wait, some after.
struct Signaller {
    producer: FutureProducer<ProducerReady>,
    codec: Codec,
    topic: String,
}

impl Signaller {
    async fn new(settings: &DriverSettings) -> anyhow::Result<Self> {
        Ok(Self {
            producer: ready_producer(settings).await?,
            codec: Codec::from_config(&settings.broker.registry)?,
            topic: settings.signal_topic.clone(),
        })
    }

    async fn send_due(&self, jobs: &mut HashMap<Uuid, Tracked>) -> anyhow::Result<()> {
        let known = ["QUEUED", "RUNNING", "WAITING"];
        for (id, job) in jobs.iter_mut() {
            if !known.contains(&job.status.as_str()) {
                continue;
            }
            let Some(payload) = job.signal.take() else {
                continue;
            };
            let signal = WorkflowRunSignal::new(
                *id,
                "payment-settled",
                payload,
                json!({"system": "the demo's payment provider"}),
                Some(format!("settled-{id}")),
            )?;
            let bytes = self.codec.encode(&self.topic, &signal).await?;
            let key = id.to_string();
            let record = FutureRecord::to(&self.topic).key(&key).payload(&bytes);
            self.producer
                .send(record, Duration::from_secs(30))
                .await
                .map_err(|(e, _)| anyhow::anyhow!("producing a signal: {e}"))?;
        }
        Ok(())
    }
}

impl Drop for Signaller {
    fn drop(&mut self) {
        // librdkafka can block in a client's destructor: not on the runtime.
        let producer = self.producer.clone();
        std::thread::spawn(move || drop(producer));
    }
}

/// Produces one request per planned sample; returns them by job id.
async fn produce(settings: &DriverSettings) -> anyhow::Result<HashMap<Uuid, Tracked>> {
    let codec = Codec::from_config(&settings.broker.registry)?;
    let producer = ready_producer(settings).await?;
    let mut jobs = HashMap::new();
    let mut deliveries = Vec::new();
    let mut counts: BTreeMap<Kind, usize> = BTreeMap::new();
    for kind in samples::plan(settings.jobs as usize) {
        let n = counts.entry(kind).or_default();
        *n += 1;
        let request = WorkflowRunRequest::new(Uuid::new_v4(), kind.workflow(), kind.input(*n))?;
        let payload = codec.encode(&settings.request_topic, &request).await?;
        let key = request.job_id().to_string();
        let record = FutureRecord::to(&settings.request_topic)
            .key(&key)
            .payload(&payload);
        let delivery = producer
            .send_result(record)
            .map_err(|(e, _)| anyhow::anyhow!("producing: {e}"))?;
        deliveries.push(delivery);
        jobs.insert(
            request.job_id(),
            Tracked {
                kind,
                produced_at: Utc::now(),
                status: "PRODUCED".into(),
                answered: false,
                checkpoints: Value::Null,
                // The payment provider's answer: sent once the job is known.
                signal: (kind == Kind::Signalled)
                    .then(|| json!({"amount": request.input()["amount"]})),
            },
        );
    }
    for delivery in deliveries {
        delivery
            .await
            .context("the producer went away")?
            .map_err(|(e, _)| anyhow::anyhow!("a request was not delivered: {e}"))?;
    }
    // librdkafka can block in a client's destructor: not on the runtime.
    std::thread::spawn(move || drop(producer));
    Ok(jobs)
}

/// What the event topic held for the run's jobs.
#[derive(Debug, Default)]
pub struct Events {
    pub by_type: BTreeMap<String, usize>,
    /// When each job's row was committed (its ACCEPTED event's time).
    pub accepted_at: HashMap<Uuid, DateTime<Utc>>,
    /// When each job's COMPLETED event happened (its commit).
    pub completed_at: HashMap<Uuid, DateTime<Utc>>,
    /// When this reader had each job's COMPLETED event.
    pub completed_read_at: HashMap<Uuid, DateTime<Utc>>,
}

/// A reader of the whole event topic from its start, every partition
/// assigned to it directly: no consumer group to join (on a broker just
/// started, joining took a new group seconds, and every event of the burst
/// was then read late at once), nothing committed.
///
/// # Errors
/// The client cannot be made, or the topic's partitions are not known.
pub(crate) async fn event_reader(settings: &DriverSettings) -> anyhow::Result<StreamConsumer> {
    let consumer: StreamConsumer = settings
        .broker
        .manual_commit_consumer(&format!("flotilla-demo-{}", Uuid::new_v4()))
        .create()?;
    let consumer = std::sync::Arc::new(consumer);
    let topic = settings.event_topic.clone();
    let assigned = std::sync::Arc::clone(&consumer);
    // librdkafka's metadata call blocks: off the async workers.
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        // A broker answers for a topic made moments ago before it knows
        // the topic's partitions: ask again until it does.
        let deadline = Instant::now() + Duration::from_secs(30);
        let partitions = loop {
            let metadata = assigned
                .fetch_metadata(Some(&topic), Duration::from_secs(10))
                .with_context(|| format!("reading the partitions of {topic}"))?;
            let ids: Vec<i32> = metadata
                .topics()
                .iter()
                .flat_map(|t| t.partitions())
                .map(rdkafka::metadata::MetadataPartition::id)
                .collect();
            if !ids.is_empty() {
                break ids;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{topic} has no partitions after 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut assignment = rdkafka::TopicPartitionList::new();
        for partition in partitions {
            assignment.add_partition_offset(&topic, partition, rdkafka::Offset::Beginning)?;
        }
        assigned.assign(&assignment)?;
        Ok(())
    })
    .await??;
    std::sync::Arc::into_inner(consumer).context("the reader is still shared")
}

/// Reads the event topic from its start until every job has a terminal
/// event. It starts before the requests are produced, so the time it reads
/// an event is when the event reached a consumer; the run's job ids arrive
/// on `ids` once every request is produced.
async fn read_events(
    settings: DriverSettings,
    ids: tokio::sync::oneshot::Receiver<Vec<Uuid>>,
    deadline: Instant,
) -> anyhow::Result<Events> {
    let consumer = event_reader(&settings).await?;
    // One codec for the whole read: it caches the schemas it resolves.
    let codec = Codec::from_config(&settings.broker.registry)?;
    let mut ids = ids;
    let mut run: Option<std::collections::HashSet<Uuid>> = None;
    let mut seen = std::collections::HashSet::new();
    let mut ended = std::collections::HashSet::new();
    let mut read: Vec<WorkflowRunEvent> = Vec::new();
    let mut events = Events::default();
    let mut stream = consumer.stream();
    while run.as_ref().is_none_or(|run| !run.is_subset(&ended)) {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let message = tokio::select! {
            message = tokio::time::timeout(remaining, stream.next()) => message,
            produced = &mut ids, if run.is_none() => {
                run = Some(produced?.into_iter().collect());
                continue;
            }
        };
        let Ok(Some(message)) = message else {
            let waiting = run.as_ref().map_or(0, |run| run.difference(&ended).count());
            bail!(
                "{waiting} jobs had no terminal event on {} by the deadline",
                settings.event_topic
            );
        };
        let message = message?;
        let Some(payload) = message.payload() else {
            continue;
        };
        let event: WorkflowRunEvent = codec.decode(payload).await?;
        if !seen.insert(event.event_id()) {
            continue;
        }
        match event.event_type() {
            WorkflowRunEventType::Accepted => {
                events
                    .accepted_at
                    .insert(event.job_id(), event.occurred_at());
            }
            WorkflowRunEventType::Completed => {
                events
                    .completed_at
                    .insert(event.job_id(), event.occurred_at());
                events.completed_read_at.insert(event.job_id(), Utc::now());
                ended.insert(event.job_id());
            }
            WorkflowRunEventType::Failed
            | WorkflowRunEventType::Dead
            | WorkflowRunEventType::Cancelled => {
                ended.insert(event.job_id());
            }
            _ => {}
        }
        read.push(event);
    }
    let run = run.unwrap_or_default();
    for event in read.iter().filter(|event| run.contains(&event.job_id())) {
        *events
            .by_type
            .entry(event.event_type().as_str().to_owned())
            .or_default() += 1;
    }
    drop(stream);
    std::thread::spawn(move || {
        consumer.unsubscribe();
        drop(consumer);
    });
    Ok(events)
}

/// The worker's HTTP API, as the demo uses it.
struct Api {
    client: reqwest::Client,
    url: String,
    token: Option<SecretString>,
}

impl Api {
    fn new(settings: &DriverSettings) -> anyhow::Result<Self> {
        Ok(Self {
            client: flotilla_runtime::tls::http_client()
                .timeout(Duration::from_secs(10))
                .build()?,
            url: settings.url.trim_end_matches('/').to_owned(),
            token: settings.token.clone(),
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.client.request(method, format!("{}{path}", self.url));
        match &self.token {
            Some(token) => request.bearer_auth(token.expose_secret()),
            None => request,
        }
    }

    async fn wait_ready(&self, deadline: Instant) -> anyhow::Result<()> {
        loop {
            let ready = self
                .request(reqwest::Method::GET, "/readyz")
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} never became ready", self.url);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Asks for the status and checkpoints of every job not yet terminal.
    async fn refresh(&self, jobs: &mut HashMap<Uuid, Tracked>) {
        let open: Vec<Uuid> = jobs
            .iter()
            .filter(|(_, job)| !is_terminal(&job.status))
            .map(|(id, _)| *id)
            .collect();
        let answers: Vec<(Uuid, Option<(String, Value)>)> = futures_util::stream::iter(open)
            .map(|id| async move {
                let view = async {
                    let response = self
                        .request(reqwest::Method::GET, &format!("/v1/jobs/{id}"))
                        .send()
                        .await
                        .ok()?;
                    if !response.status().is_success() {
                        return None; // 404: not ingested yet
                    }
                    let mut view: Value = response.json().await.ok()?;
                    let status = view["status"].as_str()?.to_owned();
                    Some((status, view["checkpoints"].take()))
                }
                .await;
                (id, view)
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for (id, view) in answers {
            if let (Some((status, checkpoints)), Some(job)) = (view, jobs.get_mut(&id)) {
                job.status = status;
                job.checkpoints = checkpoints;
            }
        }
    }

    /// Approves or cancels the jobs waiting for a human, as their kind says.
    async fn answer_human_steps(&self, jobs: &mut HashMap<Uuid, Tracked>) {
        for (id, job) in jobs.iter_mut() {
            if job.status != "WAITING" || job.answered {
                continue;
            }
            let (path, body) = match job.kind {
                Kind::Cancelled => (
                    format!("/v1/jobs/{id}/cancel"),
                    json!({"reason": "the demo cancels this kind"}),
                ),
                _ => (
                    format!("/v1/jobs/{id}/steps/approve/complete"),
                    json!({"response": {"approved": true, "by": "the demo"}}),
                ),
            };
            let answered = self
                .request(reqwest::Method::POST, &path)
                .json(&body)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            job.answered = answered;
        }
    }
}
