//! End to end, as a user runs it: requests produced to Kafka by an outside
//! client, worker processes and one relay process (the release binaries),
//! an HTTP target (the demo target, answering at once), and COMPLETED
//! events read back from the event topic.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use flotilla_contracts::{WorkflowRunEvent, WorkflowRunEventType, WorkflowRunRequest};
use flotilla_runtime::BrokerConfig;
use flotilla_runtime::kafka::lag::{self, LagSource};
use flotilla_tests::process::{Running, workspace_binary};
use flotilla_tests::scratch::ScratchDatabase;
use rdkafka::Message as _;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};
use serde_json::json;
use uuid::Uuid;

use crate::report::Report;

/// Partitions of the request and event topics.
const PARTITIONS: i32 = 6;

/// Which broker the fleet talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BrokerKind {
    /// librdkafka's mock cluster, served from this process: in memory, no
    /// replication, no disk; what Flotilla costs with the broker's share
    /// nearly gone.
    Mock,
    /// The Apache Kafka broker `scripts/services` runs
    /// (`KAFKA_BOOTSTRAP_SERVERS`).
    Kafka,
}

impl BrokerKind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Mock => "mock cluster",
            Self::Kafka => "Apache Kafka",
        }
    }
}

/// A broker with the run's topics on it.
struct Broker {
    bootstrap: String,
    _mock: Option<MockCluster<'static, DefaultProducerContext>>,
}

impl Broker {
    async fn start(kind: BrokerKind, topics: &[&str]) -> anyhow::Result<Self> {
        match kind {
            BrokerKind::Mock => {
                let cluster = MockCluster::new(1)?;
                for topic in topics {
                    cluster.create_topic(topic, PARTITIONS, 1)?;
                }
                Ok(Self {
                    bootstrap: cluster.bootstrap_servers(),
                    _mock: Some(cluster),
                })
            }
            BrokerKind::Kafka => {
                for topic in topics {
                    flotilla_tests::create_topic(topic, PARTITIONS).await?;
                }
                Ok(Self {
                    bootstrap: flotilla_tests::bootstrap_servers(),
                    _mock: None,
                })
            }
        }
    }
}

/// The workflows and the targets they call, in a directory of their own:
/// the demo target over HTTP (`bench`) and over a pair of Kafka topics
/// (`benchk`, `step_topics`: requests, replies).
fn write_fleet_files(dir: &Path, target: &str, step_topics: (&str, &str)) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("workflows"))?;
    let (step_requests, step_replies) = step_topics;
    std::fs::write(
        dir.join("targets.yaml"),
        format!(
            "targets:\n  bench:\n    kind: http\n    base_url: {target}\n  benchk:\n    kind: kafka\n    request_topic: {step_requests}\n    reply_topic: {step_replies}\n    timeout_ms: 60000\n"
        ),
    )?;
    let kafka = json!({"name": KAFKA_WORKFLOW, "input_schema": {},
        "steps": [{"name": "step1", "target": "benchk", "method": "score", "rules": ["amount = 1"]}]});
    std::fs::write(
        dir.join(format!("workflows/{KAFKA_WORKFLOW}.json")),
        kafka.to_string(),
    )?;
    for (name, steps) in [("bench3", 3), ("bench1", 1)] {
        let steps: Vec<_> = (1..=steps)
            .map(|n| json!({"name": format!("step{n}"), "target": "bench", "method": "lookup"}))
            .collect();
        let workflow = json!({"name": name, "input_schema": {}, "steps": steps});
        std::fs::write(
            dir.join(format!("workflows/{name}.json")),
            workflow.to_string(),
        )?;
    }
    Ok(())
}

/// When a job's COMPLETED event was committed (its `occurred_at`) and read.
#[derive(Debug, Clone, Copy)]
struct Completion {
    read: Instant,
    read_wall: chrono::DateTime<chrono::Utc>,
    committed: chrono::DateTime<chrono::Utc>,
    /// When its row was committed (its ACCEPTED event's `occurred_at`).
    accepted: Option<chrono::DateTime<chrono::Utc>>,
    /// When the relay handed the COMPLETED event to its producer (the
    /// record's create time, which the producer stamps).
    sent: Option<chrono::DateTime<chrono::Utc>>,
}

/// When a request was handed to the producer.
#[derive(Debug, Clone, Copy)]
struct Sent {
    at: Instant,
    wall: chrono::DateTime<chrono::Utc>,
}

/// What a fleet is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Workers with their claim loops, and a relay: the whole path.
    Run,
    /// Workers with no claim loops and no relay: ingestion alone.
    IngestOnly,
}

/// One fleet: its database, broker, topics and processes.
struct Fleet {
    database: ScratchDatabase,
    broker: Broker,
    requests: String,
    events: String,
    group: String,
    workers: Vec<Running>,
    relay: Option<Running>,
    target: Running,
    dir: PathBuf,
}

impl Fleet {
    async fn start(kind: BrokerKind, workers: usize, role: Role) -> anyhow::Result<Self> {
        Self::start_on_history(kind, workers, role, 0).await
    }

    /// [`Fleet::start`] on a database that already holds `expired`
    /// COMPLETED runs past their retention (8 days old), which the
    /// workers' retention removes as it would in production (a pass every
    /// 10 s, the defaults).
    async fn start_on_history(
        kind: BrokerKind,
        workers: usize,
        role: Role,
        expired: i64,
    ) -> anyhow::Result<Self> {
        let run = Uuid::new_v4().simple().to_string();
        let (requests, events) = (
            format!("bench-requests-{run}"),
            format!("bench-events-{run}"),
        );
        let group = format!("bench-workers-{run}");
        // The workers create no topics: the dead-letter topic is made here
        // with the others (a worker refuses to start without it).
        let dead_letters = flotilla_contracts::topics::dead_letter_topic(&requests);
        let (step_requests, step_replies) = (
            format!("bench-step-requests-{run}"),
            format!("bench-step-replies-{run}"),
        );
        let reply_dead_letters = flotilla_contracts::topics::dead_letter_topic(&step_replies);
        let broker = Broker::start(
            kind,
            &[
                &requests,
                &dead_letters,
                &events,
                &step_requests,
                &step_replies,
                &reply_dead_letters,
            ],
        )
        .await?;
        let database = ScratchDatabase::create("bench_e2e", 2).await?;
        if expired > 0 {
            crate::engine::history(&database.pool, expired, 8).await?;
        }
        let dir = std::env::temp_dir().join(format!("flotilla-bench-{run}"));
        let port = flotilla_tests::free_port();
        let target_addr = format!("127.0.0.1:{port}");
        write_fleet_files(
            &dir,
            &format!("http://{target_addr}"),
            (&step_requests, &step_replies),
        )?;
        // The same service answers the Kafka target's requests.
        let mut target = Command::new(workspace_binary("flotilla-demo-target"));
        target
            .env("DEMO_TARGET_ADDR", &target_addr)
            .env("DEMO_TARGET_LATENCY", "0ms")
            .env("DEMO_TARGET_KAFKA_REQUESTS", &step_requests)
            .env("KAFKA_BOOTSTRAP_SERVERS", &broker.bootstrap)
            .env_remove("SCHEMA_REGISTRY_URL")
            .env("RUST_LOG", "warn");
        let common = |command: &mut Command| {
            command
                .env("DATABASE_URL", database.url())
                .env("KAFKA_BOOTSTRAP_SERVERS", &broker.bootstrap)
                .env("SCHEMA_REGISTRY_URL", "")
                .env("FLOTILLA_CREATE_TOPICS", "false")
                .env("RUST_LOG", "warn,flotilla_worker=info,flotilla_relay=info")
                .env("NO_COLOR", "1");
        };
        let mut commands = Vec::new();
        for n in 0..workers {
            let mut worker = Command::new(workspace_binary("flotilla-worker"));
            common(&mut worker);
            // As for the reader: the mock cluster holds an empty fetch for
            // the whole wait, where Kafka answers as soon as a record
            // arrives; Kafka's workers run with the defaults.
            if kind == BrokerKind::Mock {
                worker.args(["--kafka-property", "fetch.wait.max.ms=10"]);
            }
            worker
                .env("FLOTILLA_WORKER_ID", format!("bench-worker-{n}"))
                .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
                .env("FLOTILLA_API_TOKENS", "bench")
                .env("FLOTILLA_REQUEST_TOPIC", &requests)
                .env("FLOTILLA_CONSUMER_GROUP", &group)
                .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
                .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"));
            if role == Role::IngestOnly {
                worker.env("FLOTILLA_WORKER_COUNT", "0");
            }
            commands.push(worker);
        }
        let mut relay = Command::new(workspace_binary("flotilla-relay"));
        common(&mut relay);
        relay
            .env("FLOTILLA_EVENT_TOPIC", &events)
            .env("FLOTILLA_RELAY_ID", "bench-relay")
            .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0");
        let (target, workers, relay) = tokio::task::spawn_blocking(move || {
            let mut target = Running::start(target);
            target.wait_for_line("demo target listening", Duration::from_secs(30));
            let workers: Vec<Running> = commands
                .into_iter()
                .map(|command| {
                    let mut worker = Running::start(command);
                    worker.wait_for_line("worker ready", Duration::from_secs(60));
                    worker
                })
                .collect();
            let relay = (role == Role::Run).then(|| {
                let mut relay = Running::start(relay);
                relay.wait_for_line("relay ready", Duration::from_secs(60));
                relay
            });
            (target, workers, relay)
        })
        .await?;
        Ok(Self {
            database,
            broker,
            requests,
            events,
            group,
            workers,
            relay,
            target,
            dir,
        })
    }

    /// Whether the workers' group has committed every partition of the
    /// request topic to its end.
    async fn committed_to_end(&self) -> anyhow::Result<bool> {
        let source = LagSource {
            broker: BrokerConfig::new(&self.broker.bootstrap),
            group: self.group.clone(),
            topic: self.requests.clone(),
        };
        let partitions = lag::read(&source, Duration::from_secs(10)).await?;
        anyhow::ensure!(
            partitions.len() == PARTITIONS as usize,
            "the request topic has {} partitions, not {PARTITIONS}",
            partitions.len()
        );
        Ok(partitions.iter().all(|p| p.lag == 0))
    }

    fn producer(&self) -> anyhow::Result<FutureProducer> {
        Ok(BrokerConfig::new(&self.broker.bootstrap)
            .idempotent_producer()
            .set("queue.buffering.max.ms", "5")
            .create()?)
    }

    /// Reads COMPLETED events until every job of `jobs` has one; returns
    /// when each arrived. It reads from the event topic's end as it is when
    /// called: what an earlier run of the same fleet published is not read
    /// (read from the start, the events of the throughput run before the
    /// latency run, 25,000 to 100,000 of them, held the first paced jobs'
    /// events back while the reader caught up: they were the p99).
    async fn read_completed(
        &self,
        jobs: HashSet<Uuid>,
        deadline: Duration,
    ) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<HashMap<Uuid, Completion>>>> {
        let consumer: StreamConsumer = BrokerConfig::new(&self.broker.bootstrap)
            .manual_commit_consumer(&format!("bench-reader-{}", Uuid::new_v4()))
            // The mock cluster answers a fetch with nothing new only after
            // this wait, even when records arrive meanwhile: keep it short.
            .set("fetch.wait.max.ms", "10")
            .create()?;
        let events = self.events.clone();
        let (consumer, ends) = tokio::task::spawn_blocking(move || {
            let ends = (0..PARTITIONS)
                .map(|partition| {
                    consumer
                        .fetch_watermarks(&events, partition, Duration::from_secs(10))
                        .map(|(_, high)| (partition, high))
                })
                .collect::<Result<Vec<_>, _>>();
            (consumer, ends)
        })
        .await?;
        let ends = ends?;
        let mut assignment = rdkafka::TopicPartitionList::new();
        for (partition, end) in ends {
            assignment.add_partition_offset(
                &self.events,
                partition,
                rdkafka::Offset::Offset(end),
            )?;
        }
        consumer.assign(&assignment)?;
        Ok(tokio::spawn(async move {
            let stop = Instant::now() + deadline;
            let mut done = HashMap::with_capacity(jobs.len());
            // A job's events share a partition, so ACCEPTED comes first.
            let mut accepted = HashMap::with_capacity(jobs.len());
            while done.len() < jobs.len() {
                let left = stop.saturating_duration_since(Instant::now());
                let message =
                    tokio::time::timeout(left, consumer.recv())
                        .await
                        .map_err(|_| {
                            anyhow::anyhow!(
                                "only {} of {} jobs COMPLETED in time",
                                done.len(),
                                jobs.len()
                            )
                        })??;
                let Some(payload) = message.payload() else {
                    continue;
                };
                let event = flotilla_contracts::json::decode::<WorkflowRunEvent>(payload)?;
                if event.event_type() == WorkflowRunEventType::Accepted {
                    accepted.insert(event.job_id(), event.occurred_at());
                }
                if event.event_type() == WorkflowRunEventType::Completed
                    && jobs.contains(&event.job_id())
                {
                    done.entry(event.job_id()).or_insert_with(|| Completion {
                        read: Instant::now(),
                        read_wall: chrono::Utc::now(),
                        committed: event.occurred_at(),
                        accepted: accepted.get(&event.job_id()).copied(),
                        sent: message
                            .timestamp()
                            .to_millis()
                            .and_then(chrono::DateTime::from_timestamp_millis),
                    });
                }
            }
            Ok(done)
        }))
    }

    /// Produces a request of `workflow` for each of `jobs`, `pace` apart
    /// (none: as fast as the producer takes them); returns when each was
    /// handed over.
    async fn produce(
        &self,
        workflow: &str,
        jobs: &[Uuid],
        pace: Option<Duration>,
    ) -> anyhow::Result<HashMap<Uuid, Sent>> {
        let producer = self.producer()?;
        let mut sent = HashMap::with_capacity(jobs.len());
        let mut deliveries = Vec::with_capacity(jobs.len());
        let started = Instant::now();
        for (n, job) in jobs.iter().enumerate() {
            if let Some(pace) = pace {
                let due = started + pace.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
                tokio::time::sleep_until(due.into()).await;
            }
            let request = WorkflowRunRequest::new(*job, workflow, json!({"n": n}))?;
            let payload = flotilla_contracts::json::encode(&request)?;
            let key = request.job_id().to_string();
            let record = FutureRecord::to(&self.requests).key(&key).payload(&payload);
            deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
            sent.insert(
                request.job_id(),
                Sent {
                    at: Instant::now(),
                    wall: chrono::Utc::now(),
                },
            );
        }
        for delivery in deliveries {
            delivery.await?.map_err(|(e, _)| e)?;
        }
        Ok(sent)
    }

    /// Peak resident memory of the first worker and of the relay, in MiB.
    fn peak_rss_mib(&self) -> (f64, f64) {
        let mib = |kib: Option<u64>| kib.map_or(0.0, |k| k as f64 / 1024.0);
        (
            mib(self.workers[0].peak_rss_kib()),
            mib(self.relay.as_ref().and_then(Running::peak_rss_kib)),
        )
    }

    async fn stop(self) -> anyhow::Result<()> {
        let Self {
            database,
            workers,
            relay,
            target,
            dir,
            broker,
            ..
        } = self;
        let logs = dir.join("logs");
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&logs)?;
            let names = (0..workers.len())
                .map(|n| format!("worker-{n}"))
                .chain(relay.as_ref().map(|_| "relay".to_owned()))
                .chain(["target".to_owned()]);
            let processes = workers.into_iter().chain(relay).chain([target]);
            for (name, mut process) in names.zip(processes) {
                process.terminate(Duration::from_secs(30));
                std::fs::write(logs.join(format!("{name}.log")), process.output.join("\n"))?;
            }
            Ok(())
        })
        .await??;
        drop(broker);
        database.drop_now().await?;
        // The processes' output stays for a look when asked for.
        if std::env::var_os("FLOTILLA_BENCH_KEEP_LOGS").is_some() {
            println!("bench: logs in {}", dir.join("logs").display());
        } else {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    }
}

/// The 1-step workflow whose step's target is a pair of Kafka topics.
const KAFKA_WORKFLOW: &str = "bench1k";

/// Request made → reply matched, p50 and p99 in ms, over every reply the
/// fleet's jobs matched (from their rows' `step_requests`).
async fn reply_latency(fleet: &Fleet) -> anyhow::Result<(f64, f64)> {
    let (p50, p99): (Option<f64>, Option<f64>) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY waited),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY waited)
         FROM (SELECT extract(epoch FROM (e.value -> 'reply' ->> 'received_at')::timestamptz
                                      - (e.value ->> 'requested_at')::timestamptz) * 1000 AS waited
               FROM workflow_run, jsonb_each(step_requests) AS e
               WHERE e.value ? 'reply') replies",
    )
    .fetch_one(&fleet.database.pool)
    .await?;
    Ok((p50.unwrap_or(f64::NAN), p99.unwrap_or(f64::NAN)))
}

/// Returns once a job of the fleet has ended FAILED, DEAD or CANCELLED:
/// how many have, and one of their errors.
async fn ended_otherwise(fleet: &Fleet) -> (i64, String) {
    loop {
        let found: Result<(i64, Option<String>), sqlx::Error> = sqlx::query_as(
            "SELECT count(*), min(error) FROM workflow_run
             WHERE status IN ('FAILED', 'DEAD', 'CANCELLED')",
        )
        .fetch_one(&fleet.database.pool)
        .await;
        if let Ok((ended, error)) = found
            && ended > 0
        {
            return (ended, error.unwrap_or_default());
        }
        // A watchdog's pace, not a synchronisation: the reader decides.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Jobs per second from the first produce to the last COMPLETED event read.
async fn throughput(
    kind: BrokerKind,
    workflow: &str,
    workers: usize,
    jobs: usize,
) -> anyhow::Result<(f64, Fleet)> {
    let fleet = Fleet::start(kind, workers, Role::Run).await?;
    let ids: Vec<Uuid> = (0..jobs).map(|_| Uuid::new_v4()).collect();
    let reader = fleet
        .read_completed(ids.iter().copied().collect(), Duration::from_secs(1200))
        .await?;
    let started = Instant::now();
    fleet.produce(workflow, &ids, None).await?;
    // A job that ends otherwise never sends the COMPLETED event the reader
    // waits for: stop at once, saying why, instead of at the reader's deadline.
    let done = tokio::select! {
        done = reader => done??,
        (ended, error) = ended_otherwise(&fleet) => anyhow::bail!(
            "{ended} {workflow} jobs ended without completing, e.g.: {error}"
        ),
    };
    let last = done.values().map(|c| c.read).max().unwrap_or(started);
    #[allow(clippy::cast_precision_loss)]
    let rate = jobs as f64 / last.duration_since(started).as_secs_f64();
    Ok((rate, fleet))
}

/// 3-step jobs/s end to end (1 worker) while the worker's retention
/// removes a backlog of finished runs past their retention (1,000,000, or
/// 10,000 when the run is small), and the runs it removed meanwhile.
pub(crate) async fn retention_running(
    report: &mut Report,
    kind: BrokerKind,
    jobs: usize,
) -> anyhow::Result<()> {
    let broker = kind.label();
    let expired = if jobs < 1000 { 10_000 } else { 1_000_000 };
    let fleet = Fleet::start_on_history(kind, 1, Role::Run, expired).await?;
    let ids: Vec<Uuid> = (0..jobs).map(|_| Uuid::new_v4()).collect();
    let reader = fleet
        .read_completed(ids.iter().copied().collect(), Duration::from_secs(1200))
        .await?;
    let started = Instant::now();
    fleet.produce("bench3", &ids, None).await?;
    let done = tokio::select! {
        done = reader => done??,
        (ended, error) = ended_otherwise(&fleet) => anyhow::bail!(
            "{ended} bench3 jobs ended without completing, e.g.: {error}"
        ),
    };
    let last = done.values().map(|c| c.read).max().unwrap_or(started);
    let took = last.duration_since(started).as_secs_f64();
    let removed: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run_removed")
        .fetch_one(&fleet.database.pool)
        .await?;
    #[allow(clippy::cast_precision_loss)]
    {
        report.add(
            "retention",
            format!("3-step end to end, {jobs} jobs, 1 worker, retention removing {expired} finished rows, {broker}"),
            jobs as f64 / took,
            "jobs/s",
        );
        report.add(
            "retention",
            format!(
                "finished runs removed/s by the worker's retention (defaults) beside them, {broker}"
            ),
            removed as f64 / took,
            "runs/s",
        );
    }
    fleet.stop().await
}

/// Requests per second through ingestion alone: one worker with no claim
/// loops and no relay, from the first produce until every row is committed
/// and the group's offsets are committed to the end of every partition.
async fn ingestion(kind: BrokerKind, jobs: usize) -> anyhow::Result<f64> {
    let fleet = Fleet::start(kind, 1, Role::IngestOnly).await?;
    let ids: Vec<Uuid> = (0..jobs).map(|_| Uuid::new_v4()).collect();
    let started = Instant::now();
    fleet.produce("bench1", &ids, None).await?;
    let deadline = started + Duration::from_secs(1200);
    loop {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run")
            .fetch_one(&fleet.database.pool)
            .await?;
        if usize::try_from(rows).unwrap_or(0) >= jobs && fleet.committed_to_end().await? {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {rows} of {jobs} requests became rows in time"
        );
        // The figure's resolution, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    #[allow(clippy::cast_precision_loss)]
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    fleet.stop().await?;
    Ok(rate)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

/// The latency figures, in the order [`latency`] returns them.
const LATENCY_PARTS: [&str; 7] = [
    "submit → COMPLETED read",
    "submit → COMPLETED committed",
    "committed → read",
    "submit → row committed",
    "row → COMPLETED committed",
    "committed → sent",
    "sent → read",
];

/// Latencies with requests paced at `rate` jobs/s, p50/p95/p99 in ms:
/// submit → COMPLETED read back, and its two parts: submit → COMPLETED
/// committed (ingestion and the engine), committed → read (the relay and
/// the broker); the first of those split again at the row's commit (the
/// broker's delivery to a worker and ingestion; the claim and the steps),
/// the second at the record's create time (the relay's read and send; the
/// broker's delivery to the reader). Create times are in milliseconds.
async fn latency(
    fleet: &Fleet,
    workflow: &str,
    rate: f64,
    jobs: usize,
) -> anyhow::Result<[[f64; 3]; 7]> {
    let ids: Vec<Uuid> = (0..jobs).map(|_| Uuid::new_v4()).collect();
    let reader = fleet
        .read_completed(ids.iter().copied().collect(), Duration::from_secs(600))
        .await?;
    let pace = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let sent = fleet.produce(workflow, &ids, Some(pace)).await?;
    let done = reader.await??;
    let wall = |from: chrono::DateTime<chrono::Utc>, to: chrono::DateTime<chrono::Utc>| {
        (to - from).to_std().unwrap_or_default()
    };
    let mut parts: [Vec<Duration>; 7] = Default::default();
    for (job, sent) in &sent {
        if let Some(done) = done.get(job) {
            parts[0].push(done.read.duration_since(sent.at));
            parts[1].push(wall(sent.wall, done.committed));
            parts[2].push(wall(done.committed, done.read_wall));
            if let Some(accepted) = done.accepted {
                parts[3].push(wall(sent.wall, accepted));
                parts[4].push(wall(accepted, done.committed));
            }
            if let Some(relayed) = done.sent {
                parts[5].push(wall(done.committed, relayed));
                parts[6].push(wall(relayed, done.read_wall));
            }
        }
    }
    Ok(parts.map(|mut part| {
        part.sort_unstable();
        [0.5, 0.95, 0.99].map(|p| percentile(&part, p))
    }))
}

/// The end-to-end figures on one broker.
pub(crate) async fn run(report: &mut Report, kind: BrokerKind, jobs: usize) -> anyhow::Result<()> {
    let broker = kind.label();
    report.add(
        "components",
        format!("ingestion, {jobs} requests, 1 worker, rows and offsets committed, {broker}"),
        ingestion(kind, jobs).await?,
        "requests/s",
    );
    for (workflow, steps) in [("bench3", 3), ("bench1", 1)] {
        for workers in [1, 2] {
            let (rate, fleet) = throughput(kind, workflow, workers, jobs).await?;
            report.add(
                "end to end",
                format!("{steps}-step, {jobs} jobs, {workers} worker(s), 1 relay, {broker}"),
                rate,
                "jobs/s",
            );
            if steps == 3 && workers == 1 {
                let (worker_mib, relay_mib) = fleet.peak_rss_mib();
                report.add(
                    "memory",
                    format!("worker peak RSS, {broker}"),
                    worker_mib,
                    "MiB",
                );
                report.add(
                    "memory",
                    format!("relay peak RSS, {broker}"),
                    relay_mib,
                    "MiB",
                );
                let paced = (jobs / 4).max(50);
                let parts = latency(&fleet, workflow, rate / 2.0, paced).await?;
                for (part, values) in LATENCY_PARTS.iter().zip(parts) {
                    for (p, value) in ["p50", "p95", "p99"].iter().zip(values) {
                        report.add(
                            "latency",
                            format!("3-step {part} {p}, half peak, {broker}"),
                            value,
                            "ms",
                        );
                    }
                }
            }
            fleet.stop().await?;
        }
    }
    // The same 1-step job with its step answered over Kafka: the request
    // leaves through the outbox and the relay, the reply comes back
    // through the request consumer.
    let (rate, fleet) = throughput(kind, KAFKA_WORKFLOW, 1, jobs).await?;
    report.add(
        "end to end",
        format!("Kafka-target step, 1-step, {jobs} jobs, 1 worker, 1 relay, {broker}"),
        rate,
        "jobs/s",
    );
    let (p50, p99) = reply_latency(&fleet).await?;
    for (p, value) in [("p50", p50), ("p99", p99)] {
        report.add(
            "latency",
            format!("Kafka-target step: request made → reply matched {p}, at full load, {broker}"),
            value,
            "ms",
        );
    }
    fleet.stop().await?;
    Ok(())
}
