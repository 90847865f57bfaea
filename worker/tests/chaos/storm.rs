//! The storm: two worker and two relay processes, a target that
//! records every call and fails some transiently, requests produced to the
//! real broker, while workers and relays are killed (SIGKILL) and restarted
//! with their ids, paused past their leases (SIGSTOP) and resumed, and the
//! workers' database link is cut for longer than a lease. Requests travel
//! as Avro through the schema registry, and some ask for a verdict failure.
//! At quiescence every guarantee is checked and the figures printed: rows =
//! requests, each job in the end state its input asked for, its events
//! 1..k in order in one partition, the workers' committed offsets at the end
//! of every partition, every step called with one idempotency key, and
//! repeated calls no more than injected 503s and worker faults explain.
//!
//! Every run has an Apache Kafka broker of its own, killed and restarted on
//! its storage halfway through the storm. It runs three times: with static
//! group membership (the worker's default), with dynamic membership under
//! the consumer group protocol (KIP-848), where a killed worker's
//! partitions move to the survivor after the broker's session timeout, and
//! with dynamic classic membership behind a transaction-mode pooler.
//!
//! CI runs it sized down; `FLOTILLA_CHAOS_FULL=1` runs 2,000 requests and a
//! longer storm. `FLOTILLA_CHAOS_SEED` picks the sequence of faults.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunEvent, WorkflowRunEventType, WorkflowRunRequest};
use flotilla_tests::kafka::{KafkaOptions, OwnKafka};
use flotilla_tests::process::Running;
use flotilla_tests::unique;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use super::{
    Faults, MIGRATOR, PARTITIONS, Recorder, call_figures, committed_offsets, count, quiesce,
    read_topics, start, start_target,
};

/// Claim loops per worker (`FLOTILLA_WORKER_COUNT`): at most this many jobs
/// are in flight on one worker, so one fault can interrupt at most this many.
const CLAIM_LOOPS: u32 = 16;

/// One request in this many asks for a verdict failure (`"fail": true`).
const FAIL_EVERY: usize = 8;

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

/// The Apache Kafka broker a run storms against: one of the run's own (a
/// free port, its own storage), so it can be killed and started again on
/// its storage without disturbing the tests beside it. `None` only while a
/// restart has it on a blocking thread.
struct Broker(Option<OwnKafka>);

impl Broker {
    /// Starts the run's broker (`scripts/kafka-node` gives members of the
    /// consumer group protocol a 10 s session, as the classic members of a
    /// dynamic run ask for).
    async fn start(dir: &Path) -> Self {
        Self(Some(OwnKafka::started(dir, KafkaOptions::default()).await))
    }

    fn address(&self) -> String {
        self.0.as_ref().unwrap().address.clone()
    }

    /// Creates the topics, `partitions` each, as an operator would.
    async fn create_topics(
        &self,
        kafka: &flotilla_runtime::BrokerConfig,
        topics: &[&str],
        partitions: i32,
    ) {
        let layout = flotilla_runtime::kafka::TopicLayout {
            create_topics: true,
            topic_partitions: partitions,
            topic_replication: 1,
            topic_min_insync_replicas: flotilla_runtime::kafka::BROKER_DEFAULT,
        };
        flotilla_runtime::kafka::ensure_topics(kafka, topics, layout)
            .await
            .unwrap();
    }

    /// Kills the broker (SIGKILL) and starts it again on its storage. What it
    /// acknowledged survives in the page cache (Kafka does not sync each
    /// write to disk; with one replica, losing the host would lose it).
    async fn restart(&mut self) -> &'static str {
        self.0 = Some(self.0.take().unwrap().restarted().await);
        "broker killed and restarted on its storage"
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
    /// The schema registry: workers read Avro requests and relays write Avro
    /// events through it.
    registry: String,
    /// How the workers join their group.
    membership: Membership,
    /// Behind a transaction-mode pooler: `worker_db` and `relay_db` reach
    /// PgBouncers, and `LISTEN` goes straight to Postgres at this URL.
    pooled_listen_db: Option<String>,
}

impl Fleet {
    /// The database settings of a worker or relay on `url`.
    fn database(&self, command: &mut Command, url: &str) {
        command.env("DATABASE_URL", url);
        if let Some(listen) = &self.pooled_listen_db {
            command
                .env("FLOTILLA_DB_POOLER", "transaction")
                .env("FLOTILLA_DB_LISTEN_URL", listen);
        }
    }
}

impl Fleet {
    fn worker(&self, n: usize) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
        self.database(&mut command, &self.worker_db);
        command
            .env("KAFKA_BOOTSTRAP_SERVERS", &self.bootstrap)
            .env("SCHEMA_REGISTRY_URL", &self.registry)
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
            .env("FLOTILLA_WORKER_COUNT", CLAIM_LOOPS.to_string())
            .env("FLOTILLA_DB_ACQUIRE_TIMEOUT", "2s")
            .env("FLOTILLA_SHUTDOWN_GRACE", "5s")
            .env(
                "FLOTILLA_STATIC_MEMBERSHIP",
                (self.membership == Membership::Static).to_string(),
            )
            .env(
                "FLOTILLA_GROUP_PROTOCOL",
                if self.membership == Membership::ConsumerProtocol {
                    "consumer"
                } else {
                    "classic"
                },
            )
            // The suite creates the topics itself (see `Broker::create_topics`).
            .env("FLOTILLA_CREATE_TOPICS", "false")
            .env("NO_COLOR", "1");
        if self.membership == Membership::Dynamic {
            // A dead dynamic member's partitions move after the session
            // timeout: 10 s instead of librdkafka's 45 s keeps the run short
            // (and shows the pass-through reaching the consumer).
            command.args(["--kafka-property", "session.timeout.ms=10000"]);
        }
        command
    }

    fn relay(&self, n: usize) -> Command {
        let mut command = Command::new(flotilla_tests::process::workspace_binary("flotilla-relay"));
        self.database(&mut command, &self.relay_db);
        command
            .env("KAFKA_BOOTSTRAP_SERVERS", &self.bootstrap)
            .env("SCHEMA_REGISTRY_URL", &self.registry)
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

fn write_fleet_files(dir: &Path, target: &str) {
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        format!("targets:\n  rec:\n    kind: http\n    base_url: {target}\n    timeout_ms: 2000\n"),
    )
    .unwrap();
    // Every step's request names the job and whether it should fail (the
    // target records calls by that job); step two's rule turns the target's
    // `"ok": false` into a verdict.
    let rules = json!(["job = input.job", "fail = input.fail"]);
    let workflow = json!({"name": "chaos", "max_attempts": 6,
    "input_schema": {"type": "object", "required": ["job", "fail"],
        "properties": {"job": {"type": "string"}, "fail": {"type": "boolean"}}},
    "steps": [
        {"name": "one", "target": "rec", "method": "one", "rules": rules},
        {"name": "two", "target": "rec", "method": "two", "rules": rules,
            "validate": ["response.ok == true"]},
        {"name": "three", "target": "rec", "method": "three", "rules": rules}
    ]});
    std::fs::write(dir.join("workflows/chaos.json"), workflow.to_string()).unwrap();
}

/// The workflow's steps, in order.
const STEPS: [&str; 3] = ["one", "two", "three"];

/// What a job's input asked for, and so how it must end.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Asked {
    /// `"fail": false`: every step done, COMPLETED.
    Complete,
    /// `"fail": true`: step two's answer breaks its `validate` rule, FAILED.
    Fail,
}

impl Asked {
    fn status(self) -> &'static str {
        match self {
            Self::Complete => "COMPLETED",
            Self::Fail => "FAILED",
        }
    }

    /// The job's events in order: ACCEPTED, a checkpoint per step done, the end.
    fn events(self) -> Vec<WorkflowRunEventType> {
        use WorkflowRunEventType::{Accepted, Completed, Failed, StepCheckpoint};
        match self {
            Self::Complete => vec![
                Accepted,
                StepCheckpoint,
                StepCheckpoint,
                StepCheckpoint,
                Completed,
            ],
            Self::Fail => vec![Accepted, StepCheckpoint, Failed],
        }
    }

    /// Whether `step` is ever called: a failing job stops at step two.
    fn calls(self, step: &str) -> bool {
        self == Self::Complete || step != "three"
    }
}

/// Static membership (the worker's default): a killed worker restarted with
/// its id gets its partitions back at once.
#[sqlx::test(migrator = "MIGRATOR")]
async fn the_fleet_loses_nothing_through_kills_pauses_and_outages(pool: PgPool) {
    let run = Run {
        membership: Membership::Static,
        pooled: false,
    };
    tokio::time::timeout(size().deadline, chaos(pool, run))
        .await
        .expect("the chaos suite timed out");
}

/// Dynamic membership under the consumer group protocol (KIP-848): a
/// killed worker's partitions go to the survivor after the broker's session
/// timeout, and every reassignment (kills, restarts, pauses) finishes.
#[sqlx::test(migrator = "MIGRATOR")]
async fn the_fleet_loses_nothing_with_the_consumer_group_protocol(pool: PgPool) {
    let run = Run {
        membership: Membership::ConsumerProtocol,
        pooled: false,
    };
    tokio::time::timeout(size().deadline, chaos(pool, run))
        .await
        .expect("the chaos suite timed out");
}

/// Dynamic membership under the classic protocol, the workers and relays
/// behind PgBouncer in transaction mode (the workers' pooler behind the
/// proxy the storm cuts): the same guarantees through a pooler.
#[sqlx::test(migrator = "MIGRATOR")]
async fn the_fleet_loses_nothing_behind_a_transaction_mode_pooler(pool: PgPool) {
    let run = Run {
        membership: Membership::Dynamic,
        pooled: true,
    };
    tokio::time::timeout(size().deadline, chaos(pool, run))
        .await
        .expect("the chaos suite timed out");
}

/// How the workers of a run join their consumer group.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Membership {
    /// Classic protocol, `group.instance.id` keyed on the worker id.
    Static,
    /// Classic protocol, no instance id: a dead member's partitions move
    /// after its session timeout.
    Dynamic,
    /// The consumer group protocol (KIP-848), no instance id.
    ConsumerProtocol,
}

#[derive(Clone, Copy, Debug)]
struct Run {
    membership: Membership,
    /// The database behind PgBouncer in transaction mode.
    pooled: bool,
}

/// PgBouncer in front of `upstream`, started off the runtime.
async fn pooler(upstream: std::net::SocketAddr) -> flotilla_tests::pgbouncer::PgBouncer {
    tokio::task::spawn_blocking(move || {
        flotilla_tests::pgbouncer::PgBouncer::start(upstream, CLAIM_LOOPS)
    })
    .await
    .unwrap()
}

#[allow(clippy::too_many_lines)]
async fn chaos(pool: PgPool, run: Run) {
    let size = size();
    let seed = std::env::var("FLOTILLA_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f10a);
    let mut faults = Faults(seed);
    let recorder = Recorder {
        flaky: Some(flaky),
        ..Recorder::default()
    };
    let target = start_target(recorder.clone()).await;
    let dir = std::env::temp_dir().join(format!("flotilla-chaos-{}", Uuid::new_v4()));
    write_fleet_files(&dir, &target);

    let proxy = flotilla_tests::database::proxy_for(&pool).await;
    let mut broker = Broker::start(&dir).await;
    let direct = flotilla_tests::database::url_of(&pool).await;
    let database = flotilla_tests::database::name_of(&pool).await;
    // Kept to the end of the run: dropping one stops it.
    let poolers = if run.pooled {
        let server = flotilla_tests::database::server_address(&pool).await;
        Some((pooler(proxy.address()).await, pooler(server).await))
    } else {
        None
    };
    let (worker_db, relay_db) = match &poolers {
        Some((workers, relays)) => (workers.url(&database), relays.url(&database)),
        None => (
            flotilla_tests::database::url_through(&pool, &proxy).await,
            direct.clone(),
        ),
    };
    // Avro through the registry of `scripts/services`.
    let registry = flotilla_tests::schema_registry_url();
    let codec = Arc::new(Codec::with_registry(&registry).unwrap());
    let fleet = Arc::new(Fleet {
        bootstrap: broker.address(),
        topic: unique("chaos-requests"),
        events: unique("chaos-events"),
        group: unique("chaos-workers"),
        worker_db,
        relay_db,
        registry,
        dir: dir.clone(),
        membership: run.membership,
        pooled_listen_db: poolers.is_some().then_some(direct),
    });
    let kafka = flotilla_runtime::BrokerConfig::new(&fleet.bootstrap);
    let dead_letters = flotilla_contracts::topics::dead_letter_topic(&fleet.topic);
    broker
        .create_topics(
            &kafka,
            &[&fleet.topic, &dead_letters, &fleet.events],
            PARTITIONS,
        )
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
        let codec = codec.clone();
        let (requests, storm) = (size.requests, size.storm);
        tokio::spawn(async move {
            // As a client should: the idempotent producer, whose retries
            // across the broker's restart the broker drops as repeats.
            // Workers keep one row per job id anyway, and the run counts
            // any repeat that lands.
            let producer: rdkafka::producer::FutureProducer =
                kafka.idempotent_producer().create().unwrap();
            let gap = storm / u32::try_from(requests).unwrap();
            let mut asked = Vec::with_capacity(requests);
            let mut deliveries = Vec::with_capacity(requests);
            for i in 0..requests {
                let job = Uuid::new_v4();
                let wants = if i % FAIL_EVERY == FAIL_EVERY / 2 {
                    Asked::Fail
                } else {
                    Asked::Complete
                };
                let input = json!({"job": job.to_string(), "fail": wants == Asked::Fail});
                let request = WorkflowRunRequest::new(job, "chaos", input).unwrap();
                let payload = codec.encode(&topic, &request).await.unwrap();
                let key = job.to_string();
                let record = rdkafka::producer::FutureRecord::to(&topic)
                    .key(&key)
                    .payload(&payload);
                // Sent at an even pace; acknowledgements are awaited at the end.
                deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
                asked.push((job, wants));
                tokio::time::sleep(gap).await;
            }
            for delivery in deliveries {
                delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
            asked
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
    let mut broker_restarts = 0u32;
    while Instant::now() < storm_end {
        if !broker_restarted && Instant::now() >= midpoint {
            broker_restarted = true;
            let what = broker.restart().await;
            *tally.entry(what).or_default() += 1;
            broker_restarts += 1;
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
                *tally.entry(WORKERS_KILLED).or_default() += 1;
            }
            1 => {
                relays[n].kill();
                let fleet = fleet.clone();
                relays[n] =
                    tokio::task::spawn_blocking(move || start(fleet.relay(n), "relay ready"))
                        .await
                        .unwrap();
                *tally.entry(RELAYS_KILLED).or_default() += 1;
            }
            2 => {
                workers[n].signal("STOP");
                tokio::time::sleep(Duration::from_secs(6)).await; // past the 4 s lease
                workers[n].signal("CONT");
                *tally.entry(WORKERS_PAUSED).or_default() += 1;
            }
            3 => {
                relays[n].signal("STOP");
                tokio::time::sleep(Duration::from_secs(3)).await; // past the 2 s lease
                relays[n].signal("CONT");
                *tally.entry(RELAYS_PAUSED).or_default() += 1;
            }
            _ => {
                proxy.cut();
                tokio::time::sleep(Duration::from_secs(5)).await; // longer than a lease
                proxy.restore();
                *tally.entry(DATABASE_CUTS).or_default() += 1;
            }
        }
    }
    let asked: Vec<(Uuid, Asked)> = producer.await.unwrap();
    let produced: HashMap<Uuid, Asked> = asked.iter().copied().collect();
    assert_eq!(produced.len(), asked.len(), "distinct job ids produced");

    quiesce(&pool, produced.len(), Duration::from_secs(150)).await;

    // Everything the checks need, read back before any is asserted, so the
    // figures are printed even when a check fails.
    let rows: Vec<(Uuid, String, i64, Option<String>)> =
        sqlx::query_as("SELECT job_id, status, event_sequence, error FROM workflow_run")
            .fetch_all(&pool)
            .await
            .unwrap();
    let by_job: HashMap<Uuid, (String, i64, Option<String>)> = rows
        .iter()
        .map(|(job, status, k, error)| (*job, (status.clone(), *k, error.clone())))
        .collect();
    let lost: Vec<Uuid> = asked
        .iter()
        .map(|(job, _)| *job)
        .filter(|job| !by_job.contains_key(job))
        .collect();
    let dead = count(
        &pool,
        "SELECT count(*) FROM workflow_run WHERE status = 'DEAD'",
    )
    .await;
    let failed_events = count(
        &pool,
        "SELECT count(*) FROM workflow_run_outbox_state WHERE status = 'FAILED'",
    )
    .await;
    let offsets = committed_offsets(&kafka, &fleet.group, &fleet.topic).await;
    let records = read_topics(&kafka, &[&fleet.topic, &fleet.events]).await;
    let mut requests: Vec<(i32, Uuid)> = Vec::new();
    // Per job: its events deduplicated by event id, and the partitions they came from.
    let mut streams: HashMap<Uuid, Vec<(i64, WorkflowRunEventType)>> = HashMap::new();
    let mut seen_events = HashSet::new();
    let mut delivered = 0usize;
    let mut partitions_per_job: HashMap<Uuid, HashSet<i32>> = HashMap::new();
    for record in &records {
        if record.topic == fleet.topic {
            let request: WorkflowRunRequest = codec.decode(&record.payload).await.unwrap();
            requests.push((record.partition, request.job_id()));
            continue;
        }
        delivered += 1;
        let event: WorkflowRunEvent = codec.decode(&record.payload).await.unwrap();
        partitions_per_job
            .entry(event.job_id())
            .or_default()
            .insert(record.partition);
        if seen_events.insert(event.event_id()) {
            streams
                .entry(event.job_id())
                .or_default()
                .push((event.sequence(), event.event_type()));
        }
    }
    let distinct_requests: HashSet<Uuid> = requests.iter().map(|(_, job)| *job).collect();
    let calls = recorder.calls.lock().unwrap().clone();
    let figures = call_figures(&calls);
    let tallied = |what: &str| tally.get(what).copied().unwrap_or(0);
    // A worker fault interrupts at most the jobs in flight on the workers it
    // hits, one call each: a kill or a pause hits one worker, a database cut
    // both. The broker and the relays run no steps.
    let worker_faults =
        tallied(WORKERS_KILLED) + tallied(WORKERS_PAUSED) + 2 * tallied(DATABASE_CUTS);
    let allowance = usize::try_from(worker_faults * CLAIM_LOOPS).unwrap();
    let asked_to_fail = asked.iter().filter(|(_, a)| *a == Asked::Fail).count();
    let distinct_events = seen_events.len();

    println!(
        "chaos (seed {seed:#x}, {}{}, Avro through the registry): {} requests over {:?}, {asked_to_fail} asking to fail",
        match run.membership {
            Membership::Static => "Apache Kafka, static membership",
            Membership::Dynamic => "Apache Kafka, dynamic membership (classic protocol)",
            Membership::ConsumerProtocol => "Apache Kafka, consumer group protocol (KIP-848)",
        },
        if run.pooled {
            ", behind PgBouncer in transaction mode"
        } else {
            ""
        },
        produced.len(),
        size.storm
    );
    for (what, n) in &tally {
        println!("  {what}: {n}");
    }
    println!(
        "  requests on the topic: {} ({} distinct, {} repeated by the producer); committed offset / high watermark per partition: {}",
        requests.len(),
        distinct_requests.len(),
        requests.len() - distinct_requests.len(),
        offsets
            .iter()
            .map(|(p, at, high)| format!("p{p} {at}/{high}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  jobs: {} COMPLETED, {} FAILED, {dead} DEAD",
        rows.iter().filter(|r| r.1 == "COMPLETED").count(),
        rows.iter().filter(|r| r.1 == "FAILED").count(),
    );
    println!(
        "  events: {distinct_events} distinct, {delivered} delivered ({} duplicates, consumers dedupe)",
        delivered - distinct_events
    );
    println!(
        "  step calls: {}, repeated {}: {} after {} injected 503s, {} after worker faults (at most {worker_faults} faults x {CLAIM_LOOPS} claim loops = {allowance}); most calls of one step: {}",
        figures.calls,
        figures.repeats,
        figures.after_503s,
        figures.injected_503s,
        figures.after_faults,
        figures.most
    );
    println!(
        "  rows {} = requests {}; lost {}",
        rows.len(),
        produced.len(),
        lost.len()
    );
    println!(
        "  tally: killed {} ({} workers, {} relays), paused {} ({} workers, {} relays), restarted {}, database cuts {}, duplicates delivered {} (events {}, requests {}), lost {}",
        tallied(WORKERS_KILLED) + tallied(RELAYS_KILLED),
        tallied(WORKERS_KILLED),
        tallied(RELAYS_KILLED),
        tallied(WORKERS_PAUSED) + tallied(RELAYS_PAUSED),
        tallied(WORKERS_PAUSED),
        tallied(RELAYS_PAUSED),
        tallied(WORKERS_KILLED) + tallied(RELAYS_KILLED) + broker_restarts,
        tallied(DATABASE_CUTS),
        delivered - distinct_events + requests.len() - distinct_requests.len(),
        delivered - distinct_events,
        requests.len() - distinct_requests.len(),
        lost.len()
    );

    // Rows: exactly the requests produced, none lost, none twice.
    assert_eq!(
        rows.len(),
        produced.len(),
        "one row per request, no duplicates"
    );
    assert!(lost.is_empty(), "requests without a row: {lost:?}");
    assert_eq!(
        by_job.keys().copied().collect::<HashSet<_>>(),
        produced.keys().copied().collect(),
        "rows are the requests produced"
    );

    // Offsets: the workers' group committed the end of every partition, and
    // every request below a committed offset has its row.
    for (partition, at, high) in &offsets {
        assert_eq!(
            at, high,
            "partition {partition}: committed offset {at}, high watermark {high}"
        );
    }
    assert_eq!(
        distinct_requests,
        produced.keys().copied().collect(),
        "the request topic holds exactly the requests produced"
    );
    for (partition, job) in &requests {
        assert!(
            by_job.contains_key(job),
            "request {job} on partition {partition} is below the committed offset but has no row"
        );
    }

    // End states: each job as its input asked, no job DEAD, no event FAILED.
    assert_eq!(dead, 0, "no job DEAD");
    assert_eq!(failed_events, 0, "no outbox row FAILED");
    for (job, wants) in &produced {
        let (status, k, error) = &by_job[job];
        assert_eq!(status, wants.status(), "job {job}: asked {wants:?}");
        assert_eq!(
            *k,
            i64::try_from(wants.events().len()).unwrap(),
            "job {job} ({status}): event count"
        );
        if *wants == Asked::Fail {
            let error = error.as_deref().unwrap_or_default();
            assert!(
                error.contains("failed validation"),
                "job {job}: FAILED by its verdict, not {error:?}"
            );
        }
    }

    // Events: per job, deduplicated by event id, exactly 1..k in order, of
    // the types its end asks for, all in one partition.
    assert_eq!(
        distinct_events,
        rows.iter()
            .map(|(_, _, k, _)| usize::try_from(*k).unwrap())
            .sum::<usize>(),
        "every event on the topic"
    );
    for (job, wants) in &produced {
        let partitions = partitions_per_job.get(job).cloned().unwrap_or_default();
        assert_eq!(
            partitions.len(),
            1,
            "job {job}: one partition, not {partitions:?}"
        );
        let want: Vec<(i64, WorkflowRunEventType)> = (1..).zip(wants.events()).collect();
        let got = streams.get(job).cloned().unwrap_or_default();
        assert_eq!(got, want, "job {job}: events 1..k in order");
    }

    // Steps: every call names a produced job and carries that job's and
    // step's idempotency key; each step the job's end needs is called at
    // least once, step three of a failing job never.
    assert!(
        calls.keys().all(|(job, _)| produced.contains_key(job)),
        "calls for jobs never produced: {:?}",
        calls
            .keys()
            .filter(|(job, _)| !produced.contains_key(job))
            .collect::<Vec<_>>()
    );
    assert!(
        figures.wrong_keys.is_empty(),
        "calls whose idempotency key is not <job>:<step> (so a repeat's differs from the first's): {:?}",
        figures.wrong_keys
    );
    for (job, wants) in &produced {
        for step in STEPS {
            let n = calls.get(&(*job, step.to_owned())).map_or(0, Vec::len);
            if wants.calls(step) {
                assert!(n >= 1, "job {job}: step {step} never called");
            } else {
                assert_eq!(n, 0, "job {job} ({wants:?}): step {step} called");
            }
        }
    }
    // Repeats: each 503 is retried once; every other repeat needs a worker
    // fault that interrupted the job, and each fault interrupts at most a
    // claim loop's worth of jobs on each worker it hits.
    assert!(
        figures.after_faults <= allowance,
        "{} repeated calls not after a 503, more than {worker_faults} worker faults x {CLAIM_LOOPS} claim loops explain",
        figures.after_faults
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

const WORKERS_KILLED: &str = "workers killed and restarted";
const RELAYS_KILLED: &str = "relays killed and restarted";
const WORKERS_PAUSED: &str = "workers paused past their lease";
const RELAYS_PAUSED: &str = "relays paused past their lease";
const DATABASE_CUTS: &str = "database cut from the workers";
