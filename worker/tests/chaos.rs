//! The chaos suite: two worker and two relay processes, a target that
//! records every call and fails some transiently, requests produced to the
//! real broker, while workers and relays are killed (SIGKILL) and restarted
//! with their ids, paused past their leases (SIGSTOP) and resumed, and the
//! workers' database link is cut for longer than a lease. At quiescence
//! every guarantee is checked and the figures printed.
//!
//! It runs twice: on the test broker with static group membership (which
//! that broker needs: it never hands a dead member's partitions to another),
//! and on librdkafka's mock cluster with static membership off, where a
//! killed worker's partitions move to the survivor after the session timeout.
//!
//! CI runs it sized down; `FLOTILLA_CHAOS_FULL=1` runs 2,000 requests and a
//! longer storm. `FLOTILLA_CHAOS_SEED` picks the sequence of faults.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use flotilla_contracts::WorkflowRunEvent;
use flotilla_tests::process::Running;
use flotilla_tests::tansu::OwnBroker;
use flotilla_tests::{close_consumer, unique};
use rdkafka::Message as _;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// The size of a run: CI's, or the full one.
struct Size {
    requests: usize,
    storm: Duration,
    /// The whole run's deadline, so a hang fails instead of eating CI.
    deadline: Duration,
}

fn size() -> Size {
    if std::env::var("FLOTILLA_CHAOS_FULL").is_ok_and(|v| v == "1") {
        Size {
            requests: 2000,
            storm: Duration::from_secs(180),
            deadline: Duration::from_secs(1100),
        }
    } else {
        Size {
            requests: 200,
            storm: Duration::from_secs(40),
            deadline: Duration::from_secs(400),
        }
    }
}

/// The share of (job, step) pairs whose first call answers 503, in percent
/// (`FLOTILLA_CHAOS_FAIL_PERCENT`, 10 by default).
fn fail_percent() -> u128 {
    std::env::var("FLOTILLA_CHAOS_FAIL_PERCENT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(10)
}

/// Whether the first call of `job`'s steps fails transiently.
fn flaky(job: Uuid) -> bool {
    job.as_u128() % 100 < fail_percent()
}

/// A small deterministic random sequence (xorshift), so a failing run can be replayed.
struct Faults(u64);

impl Faults {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// Every call the target saw: (job, step) → count; the first calls of some
/// jobs' steps answer 503 (transient, see [`flaky`]), so retries happen too.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<HashMap<(Uuid, String), u32>>>);

async fn record(
    State(recorder): State<Recorder>,
    UrlPath(step): UrlPath<String>,
    headers: HeaderMap,
) -> (StatusCode, axum::Json<serde_json::Value>) {
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    let job: Uuid = key.split(':').next().unwrap().parse().unwrap();
    let calls = {
        let mut seen = recorder.0.lock().unwrap();
        let n = seen.entry((job, step.clone())).or_default();
        *n += 1;
        *n
    };
    if calls == 1 && flaky(job) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"busy": true})),
        );
    }
    (StatusCode::OK, axum::Json(json!({"step": step})))
}

async fn start_target(recorder: Recorder) -> String {
    let app = axum::Router::new()
        .route("/{step}", post(record))
        .with_state(recorder);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// The broker a run storms against.
enum Broker {
    /// The shared test broker, when `scripts/services` reused one without
    /// saying where its binary is (`FLOTILLA_TANSU_BIN`): never restarted.
    Shared(String),
    /// tansu of the suite's own (a free port, its own SQLite file), so it can
    /// be restarted on its storage without disturbing the tests beside it.
    /// `None` only while a restart has it on a blocking thread.
    Tansu(Option<OwnBroker>),
    /// librdkafka's mock cluster, served on a local port from this process:
    /// ordinary (dynamic) group semantics, which the test broker lacks.
    Mock(MockCluster<'static, DefaultProducerContext>),
}

impl Broker {
    /// tansu of the suite's own, or the shared broker without `FLOTILLA_TANSU_BIN`.
    async fn tansu(dir: &Path) -> Self {
        let Some(bin) = flotilla_tests::tansu::binary() else {
            return Self::Shared(flotilla_tests::bootstrap_servers());
        };
        let dir = dir.to_owned();
        let tansu = tokio::task::spawn_blocking(move || OwnBroker::start(&bin, &dir, None, &[]))
            .await
            .unwrap();
        Self::Tansu(Some(tansu))
    }

    fn mock() -> Self {
        Self::Mock(MockCluster::new(1).expect("librdkafka's mock cluster starts"))
    }

    fn address(&self) -> String {
        match self {
            Self::Shared(address) => address.clone(),
            Self::Tansu(tansu) => tansu.as_ref().unwrap().address.clone(),
            Self::Mock(cluster) => cluster.bootstrap_servers(),
        }
    }

    /// Creates the topics, `partitions` each: through the admin API, or
    /// directly on the mock cluster (whose admin API does not answer).
    async fn create_topics(
        &self,
        kafka: &flotilla_runtime::BrokerConfig,
        topics: &[&str],
        partitions: i32,
    ) {
        if let Self::Mock(cluster) = self {
            for topic in topics {
                cluster.create_topic(topic, partitions, 1).unwrap();
            }
            return;
        }
        let layout = flotilla_runtime::kafka::TopicLayout {
            create_topics: true,
            topic_partitions: partitions,
            topic_replication: 1,
        };
        flotilla_runtime::kafka::ensure_topics(kafka, topics, layout)
            .await
            .unwrap();
    }

    /// Takes the broker away for a while and brings it back: tansu is killed
    /// and started again on its storage; the mock cluster's broker goes down
    /// (connections cut, new ones refused) and up. What happened, for the
    /// tally, or `None` for the shared broker, which is never restarted.
    async fn restart(&mut self) -> Option<&'static str> {
        match self {
            Self::Shared(_) => None,
            Self::Tansu(slot) => {
                let mut tansu = slot.take().unwrap();
                *slot = Some(
                    tokio::task::spawn_blocking(move || {
                        tansu.restart_with(&[]);
                        tansu
                    })
                    .await
                    .unwrap(),
                );
                Some("broker restarted on its storage")
            }
            Self::Mock(cluster) => {
                cluster.broker_down(1).unwrap();
                tokio::time::sleep(Duration::from_secs(3)).await;
                cluster.broker_up(1).unwrap();
                Some("broker taken down for 3 s")
            }
        }
    }
}

struct Fleet {
    dir: PathBuf,
    bootstrap: String,
    topic: String,
    events: String,
    group: String,
    worker_db: String,
    relay_db: String,
    /// Off on the mock cluster: the case of a group without static members.
    static_membership: bool,
}

impl Fleet {
    fn worker(&self, n: usize) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
        command
            .env("DATABASE_URL", &self.worker_db)
            .env("KAFKA_BOOTSTRAP_SERVERS", &self.bootstrap)
            .env("SCHEMA_REGISTRY_URL", "")
            .env("FLOTILLA_WORKER_ID", format!("chaos-worker-{n}"))
            .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
            .env("FLOTILLA_API_TOKENS", "chaos")
            .env("FLOTILLA_REQUEST_TOPIC", &self.topic)
            .env("FLOTILLA_CONSUMER_GROUP", &self.group)
            .env("FLOTILLA_TARGETS_FILE", self.dir.join("targets.yaml"))
            .env("FLOTILLA_WORKFLOWS_DIR", self.dir.join("workflows"))
            .env("FLOTILLA_LEASE", "4s")
            .env("FLOTILLA_SWEEP_INTERVAL", "1s")
            .env("FLOTILLA_BACKOFF_BASE", "200ms")
            .env("FLOTILLA_MAX_LEASE_LOSSES", "100")
            .env("FLOTILLA_DB_ACQUIRE_TIMEOUT", "2s")
            .env("FLOTILLA_SHUTDOWN_GRACE", "5s")
            .env(
                "FLOTILLA_STATIC_MEMBERSHIP",
                self.static_membership.to_string(),
            )
            // The suite creates the topics itself (see `Broker::create_topics`).
            .env("FLOTILLA_CREATE_TOPICS", "false")
            .env("NO_COLOR", "1");
        if !self.static_membership {
            // A dead dynamic member's partitions move after the session
            // timeout: 10 s instead of librdkafka's 45 s keeps the run short
            // (and shows the pass-through reaching the consumer).
            command.args(["--kafka-property", "session.timeout.ms=10000"]);
        }
        command
    }

    fn relay(&self, n: usize) -> Command {
        let mut command = Command::new(flotilla_tests::process::workspace_binary("flotilla-relay"));
        command
            .env("DATABASE_URL", &self.relay_db)
            .env("KAFKA_BOOTSTRAP_SERVERS", &self.bootstrap)
            .env("SCHEMA_REGISTRY_URL", "")
            .env("FLOTILLA_EVENT_TOPIC", &self.events)
            .env("FLOTILLA_RELAY_ID", format!("chaos-relay-{n}"))
            .env("FLOTILLA_RELAY_LEASE", "2s")
            .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0")
            .env("FLOTILLA_RELAY_IDLE_POLL_MAX", "50ms")
            .env("FLOTILLA_CREATE_TOPICS", "false")
            .env("NO_COLOR", "1");
        command
    }
}

fn start(command: Command, ready: &str) -> Running {
    let mut running = Running::start(command);
    running.wait_for_line(ready, Duration::from_secs(60));
    running
}

fn write_fleet_files(dir: &Path, target: &str) {
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        format!("targets:\n  rec:\n    kind: http\n    base_url: {target}\n    timeout_ms: 2000\n"),
    )
    .unwrap();
    let workflow = json!({"name": "chaos", "input_schema": {}, "max_attempts": 6,
    "steps": [
        {"name": "one", "target": "rec", "method": "one"},
        {"name": "two", "target": "rec", "method": "two"},
        {"name": "three", "target": "rec", "method": "three"}
    ]});
    std::fs::write(dir.join("workflows/chaos.json"), workflow.to_string()).unwrap();
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// On the test broker, with static membership (its default): a killed worker
/// restarted with its id gets its partitions back at once.
#[sqlx::test(migrator = "MIGRATOR")]
async fn the_fleet_loses_nothing_through_kills_pauses_and_outages(pool: PgPool) {
    tokio::time::timeout(size().deadline, chaos(pool, BrokerKind::Tansu))
        .await
        .expect("the chaos suite timed out");
}

/// On librdkafka's mock cluster, with static membership off: a killed
/// worker's partitions go to the survivor after the session timeout, and
/// every rebalance (kills, restarts, pauses) finishes.
#[sqlx::test(migrator = "MIGRATOR")]
async fn the_fleet_loses_nothing_with_dynamic_membership_on_the_mock_cluster(pool: PgPool) {
    tokio::time::timeout(size().deadline, chaos(pool, BrokerKind::Mock))
        .await
        .expect("the chaos suite timed out");
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum BrokerKind {
    Tansu,
    Mock,
}

#[allow(clippy::too_many_lines)]
async fn chaos(pool: PgPool, kind: BrokerKind) {
    let size = size();
    let seed = std::env::var("FLOTILLA_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f10a);
    let mut faults = Faults(seed);
    let recorder = Recorder::default();
    let target = start_target(recorder.clone()).await;
    let dir = std::env::temp_dir().join(format!("flotilla-chaos-{}", Uuid::new_v4()));
    write_fleet_files(&dir, &target);

    let proxy = flotilla_tests::database::proxy_for(&pool).await;
    let mut broker = match kind {
        BrokerKind::Tansu => Broker::tansu(&dir).await,
        BrokerKind::Mock => Broker::mock(),
    };
    let fleet = Arc::new(Fleet {
        bootstrap: broker.address(),
        topic: unique("chaos-requests"),
        events: unique("chaos-events"),
        group: unique("chaos-workers"),
        worker_db: flotilla_tests::database::url_through(&pool, &proxy).await,
        relay_db: flotilla_tests::database::url_of(&pool).await,
        dir: dir.clone(),
        static_membership: kind == BrokerKind::Tansu,
    });
    let kafka = flotilla_runtime::BrokerConfig::new(&fleet.bootstrap);
    let dead_letters = flotilla_contracts::topics::dead_letter_topic(&fleet.topic);
    broker
        .create_topics(&kafka, &[&fleet.topic, &dead_letters, &fleet.events], 3)
        .await;

    let spawn_all = {
        let fleet = fleet.clone();
        tokio::task::spawn_blocking(move || {
            let workers: Vec<Running> = (0..2)
                .map(|n| start(fleet.worker(n), "worker ready"))
                .collect();
            let relays: Vec<Running> = (0..2)
                .map(|n| start(fleet.relay(n), "relay ready"))
                .collect();
            (workers, relays)
        })
    };
    let (mut workers, mut relays) = spawn_all.await.unwrap();

    // Requests arrive over the whole storm, as an outside client sends them.
    let producer = {
        let topic = fleet.topic.clone();
        let kafka = kafka.clone();
        let (requests, storm) = (size.requests, size.storm);
        tokio::spawn(async move {
            let producer: rdkafka::producer::FutureProducer =
                kafka.idempotent_producer().create().unwrap();
            let gap = storm / u32::try_from(requests).unwrap();
            let mut ids = Vec::with_capacity(requests);
            let mut deliveries = Vec::with_capacity(requests);
            for _ in 0..requests {
                let request =
                    flotilla_contracts::WorkflowRunRequest::new(Uuid::new_v4(), "chaos", json!({}))
                        .unwrap();
                let payload = flotilla_contracts::json::encode(&request).unwrap();
                let key = request.job_id().to_string();
                let record = rdkafka::producer::FutureRecord::to(&topic)
                    .key(&key)
                    .payload(&payload);
                // Sent at an even pace; acknowledgements are awaited at the end.
                deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
                ids.push(request.job_id());
                tokio::time::sleep(gap).await;
            }
            for delivery in deliveries {
                delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
            ids
        })
    };

    // The storm.
    // Every kind of fault comes once per cycle, in an order the seed picks.
    let mut tally: BTreeMap<&str, u32> = BTreeMap::new();
    let mut kinds: Vec<u64> = (0..5).collect();
    let storm_end = Instant::now() + size.storm;
    let mut round: usize = 0;
    let midpoint = Instant::now() + size.storm / 2;
    let mut broker_restarted = false;
    while Instant::now() < storm_end {
        if !broker_restarted && Instant::now() >= midpoint {
            broker_restarted = true;
            if let Some(what) = broker.restart().await {
                *tally.entry(what).or_default() += 1;
            } else {
                println!(
                    "chaos: the shared broker is in use (FLOTILLA_TANSU_BIN unset); not restarting it"
                );
            }
        }
        if round.is_multiple_of(5) {
            for i in (1..kinds.len()).rev() {
                kinds.swap(i, usize::try_from(faults.next(i as u64 + 1)).unwrap());
            }
        }
        let kind = kinds[round % 5];
        round += 1;
        tokio::time::sleep(Duration::from_millis(1500 + faults.next(1500))).await;
        let n = usize::try_from(faults.next(2)).unwrap();
        match kind {
            0 => {
                workers[n].kill();
                let fleet = fleet.clone();
                workers[n] =
                    tokio::task::spawn_blocking(move || start(fleet.worker(n), "worker ready"))
                        .await
                        .unwrap();
                *tally.entry("workers killed and restarted").or_default() += 1;
            }
            1 => {
                relays[n].kill();
                let fleet = fleet.clone();
                relays[n] =
                    tokio::task::spawn_blocking(move || start(fleet.relay(n), "relay ready"))
                        .await
                        .unwrap();
                *tally.entry("relays killed and restarted").or_default() += 1;
            }
            2 => {
                workers[n].signal("STOP");
                tokio::time::sleep(Duration::from_secs(6)).await; // past the 4 s lease
                workers[n].signal("CONT");
                *tally.entry("workers paused past their lease").or_default() += 1;
            }
            3 => {
                relays[n].signal("STOP");
                tokio::time::sleep(Duration::from_secs(3)).await; // past the 2 s lease
                relays[n].signal("CONT");
                *tally.entry("relays paused past their lease").or_default() += 1;
            }
            _ => {
                proxy.cut();
                tokio::time::sleep(Duration::from_secs(5)).await; // longer than a lease
                proxy.restore();
                *tally.entry("database cut from the workers").or_default() += 1;
            }
        }
    }
    let produced: Vec<Uuid> = producer.await.unwrap();

    // Quiescence: every job settled and every event published.
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let settled = count(&pool, "SELECT count(*) FROM workflow_run WHERE status IN ('COMPLETED','FAILED','DEAD','CANCELLED')").await;
        let pending = count(
            &pool,
            "SELECT count(*) FROM workflow_run_outbox WHERE status = 'PENDING'",
        )
        .await;
        if settled == i64::try_from(produced.len()).unwrap() && pending == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no quiescence: {settled} settled of {}, {pending} events pending",
            produced.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Rows: exactly the requests produced, all COMPLETED.
    let rows: Vec<(Uuid, String, i64)> =
        sqlx::query_as("SELECT job_id, status, event_sequence FROM workflow_run")
            .fetch_all(&pool)
            .await
            .unwrap();
    let row_ids: HashSet<Uuid> = rows.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(
        rows.len(),
        produced.len(),
        "one row per request, no duplicates"
    );
    assert_eq!(
        row_ids,
        produced.iter().copied().collect(),
        "no request lost"
    );
    assert!(
        rows.iter().all(|(_, status, _)| status == "COMPLETED"),
        "every job COMPLETED"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM workflow_run_outbox WHERE status = 'FAILED'"
        )
        .await,
        0
    );

    // Events: per job, deduplicated by event id, exactly 1..k in order, one partition.
    let expected: usize = rows
        .iter()
        .map(|(_, _, k)| usize::try_from(*k).unwrap())
        .sum();
    // Read every partition from its start to its end, no group involved.
    let consumer: StreamConsumer = kafka
        .manual_commit_consumer(&unique("chaos-reader"))
        .create()
        .unwrap();
    let mut assignment = rdkafka::TopicPartitionList::new();
    let mut ends = HashMap::new();
    for partition in 0..3 {
        let (_, high) = consumer
            .fetch_watermarks(&fleet.events, partition, Duration::from_secs(10))
            .unwrap();
        ends.insert(partition, high);
        assignment
            .add_partition_offset(&fleet.events, partition, rdkafka::Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut read: HashMap<i32, i64> = HashMap::new();
    let mut seen = HashSet::new();
    let (mut delivered, mut streams) = (0usize, HashMap::<Uuid, (i32, Vec<i64>)>::new());
    while ends
        .iter()
        .any(|(p, end)| read.get(p).copied().unwrap_or(0) < *end)
    {
        let message = consumer.recv().await.unwrap();
        read.insert(message.partition(), message.offset() + 1);
        delivered += 1;
        let event =
            flotilla_contracts::json::decode::<WorkflowRunEvent>(message.payload().unwrap())
                .unwrap();
        let stream = streams
            .entry(event.job_id())
            .or_insert((message.partition(), Vec::new()));
        assert_eq!(stream.0, message.partition(), "one job, one partition");
        if seen.insert(event.event_id()) {
            stream.1.push(event.sequence());
        }
    }
    assert_eq!(seen.len(), expected, "every event on the topic");
    close_consumer(consumer);
    for (job, k) in rows.iter().map(|(id, _, k)| (id, *k)) {
        let want: Vec<i64> = (1..=k).collect();
        assert_eq!(streams[job].1, want, "job {job}: events 1..{k} in order");
    }

    // Steps: each called at least once; more only where a fault explains it.
    let calls = recorder.0.lock().unwrap().clone();
    for job in &produced {
        for step in ["one", "two", "three"] {
            assert!(
                calls.get(&(*job, step.to_owned())).copied().unwrap_or(0) >= 1,
                "{job} {step} never called"
            );
        }
    }
    let transient = produced.iter().filter(|j| flaky(**j)).count() * 3;
    let repeats: u32 = calls.values().map(|n| n - 1).sum();

    println!(
        "chaos (seed {seed:#x}, {}): {} requests over {:?}",
        match kind {
            BrokerKind::Tansu => "test broker, static membership",
            BrokerKind::Mock => "mock cluster, dynamic membership",
        },
        produced.len(),
        size.storm
    );
    for (what, n) in &tally {
        println!("  {what}: {n}");
    }
    println!(
        "  events: {expected} distinct, {delivered} delivered ({} duplicates, consumers dedupe)",
        delivered - expected
    );
    println!(
        "  step calls repeated: {repeats} ({transient} from injected 503s, the rest after kills, pauses and cuts)"
    );
    println!(
        "  rows {} = requests {}; lost 0; all COMPLETED",
        rows.len(),
        produced.len()
    );

    let stop = |mut running: Running| {
        running.signal("CONT");
        running.terminate(Duration::from_secs(30));
    };
    tokio::task::spawn_blocking(move || workers.into_iter().chain(relays).for_each(stop))
        .await
        .unwrap();
    drop(broker);
    std::fs::remove_dir_all(&dir).unwrap();
}
