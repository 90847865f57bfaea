//! A real Postgres failover under a running fleet: a primary and a streaming
//! standby of the installed Postgres (`flotilla_tests::replication`), two
//! workers and a relay whose one database address is a TCP proxy pointing
//! at the primary, requests produced continuously. While they flow the
//! primary's processes are stopped at once (`pg_ctl -m immediate`), the
//! proxy is pointed at the standby (its clients meet a read-only server for
//! a moment) and the standby is promoted.
//!
//! With asynchronous replication the standby's WAL stream is stalled for
//! the last seconds before the stop, so the commits of those seconds are
//! lost: rows, checkpoints, events and the offsets kept with them. Every
//! request produced must still end as a COMPLETED row with a COMPLETED event
//! on the event topic (the consumers read the lost requests again from the
//! offsets the database kept); step calls may repeat, and are counted.
//! With synchronous replication nothing acknowledged is lost: the standby
//! holds at least what the primary showed, each job has one COMPLETED event
//! (no second run published), and steps repeat no more than the jobs in
//! flight at the stop (a segment interrupted by a crash runs again, as the
//! contract allows).
//!
//! Kafka is the shared broker of `scripts/services`, with topics and a group
//! of the run's own: the subject is the database. The figures are
//! printed: requests produced, rows, lost commits, repeats, seconds until
//! the fleet completed jobs again.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use flotilla_contracts::{WorkflowRunEvent, WorkflowRunEventType, WorkflowRunRequest};
use flotilla_tests::process::Running;
use flotilla_tests::proxy::Proxy;
use flotilla_tests::replication::{ReplicatedPostgres, Replication};
use flotilla_tests::{close_consumer, unique};
use rdkafka::Message as _;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

const PARTITIONS: i32 = 3;
const WORKERS: usize = 2;
/// Claim loops per worker: at most this many jobs in flight on one.
const CLAIM_LOOPS: usize = 8;
/// Requests produced, at an even pace over [`PRODUCING`].
const REQUESTS: usize = 500;
const PRODUCING: Duration = Duration::from_secs(10);
/// When the primary is stopped, from the first request.
const STOP_AT: Duration = Duration::from_secs(5);
/// How long replication is stalled before the stop (asynchronous only).
const STALL: Duration = Duration::from_secs(2);
/// The whole run's deadline.
const DEADLINE: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_asynchronous_failover_loses_no_request() {
    tokio::time::timeout(DEADLINE, fail_over(Replication::Asynchronous))
        .await
        .expect("the failover run timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_synchronous_failover_loses_nothing_and_repeats_only_steps_in_flight() {
    tokio::time::timeout(DEADLINE, fail_over(Replication::Synchronous))
        .await
        .expect("the failover run timed out");
}

/// Calls per idempotency key (`<job>:<step>`).
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<HashMap<String, usize>>>);

async fn answer(State(calls): State<Calls>, headers: HeaderMap) -> axum::Json<serde_json::Value> {
    let key = headers
        .get("idempotency-key")
        .and_then(|key| key.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    *calls.0.lock().unwrap().entry(key).or_default() += 1;
    axum::Json(json!({"ok": true}))
}

async fn start_target(calls: Calls) -> String {
    let app = axum::Router::new()
        .route("/{step}", post(answer))
        .with_state(calls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn write_fleet_files(dir: &Path, target: &str) {
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        format!("targets:\n  rec:\n    kind: http\n    base_url: {target}\n    timeout_ms: 2000\n"),
    )
    .unwrap();
    let workflow = json!({"name": "failover", "max_attempts": 10, "input_schema": {},
        "steps": [{"name": "one", "target": "rec", "method": "one"}]});
    std::fs::write(dir.join("workflows/failover.json"), workflow.to_string()).unwrap();
}

struct Fleet {
    dir: std::path::PathBuf,
    bootstrap: String,
    topic: String,
    events: String,
    group: String,
    database: String,
}

impl Fleet {
    fn worker(&self, n: usize) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
        command
            .env("DATABASE_URL", &self.database)
            .env("KAFKA_BOOTSTRAP_SERVERS", &self.bootstrap)
            // JSON on the wire: the subject is the database.
            .env_remove("SCHEMA_REGISTRY_URL")
            .env("FLOTILLA_WORKER_ID", format!("failover-worker-{n}"))
            .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
            .env("FLOTILLA_API_TOKENS", "failover")
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
            .env("FLOTILLA_STATIC_MEMBERSHIP", "false")
            .env("FLOTILLA_CREATE_TOPICS", "false")
            .env("NO_COLOR", "1");
        command
    }

    fn relay(&self) -> Command {
        let mut command = Command::new(flotilla_tests::process::workspace_binary("flotilla-relay"));
        command
            .env("DATABASE_URL", &self.database)
            .env("KAFKA_BOOTSTRAP_SERVERS", &self.bootstrap)
            .env_remove("SCHEMA_REGISTRY_URL")
            .env("FLOTILLA_EVENT_TOPIC", &self.events)
            .env("FLOTILLA_RELAY_ID", "failover-relay")
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

/// Produces one request to each partition and waits until each is a
/// COMPLETED row on the primary and the group keeps an offset of every
/// partition there; returns their jobs.
async fn warm_up(
    kafka: &flotilla_runtime::BrokerConfig,
    fleet: &Fleet,
    primary: std::net::SocketAddr,
) -> Vec<Uuid> {
    let producer: rdkafka::producer::FutureProducer =
        kafka.acknowledged_producer().create().unwrap();
    let mut jobs = Vec::new();
    for partition in 0..PARTITIONS {
        let job = Uuid::new_v4();
        let request = WorkflowRunRequest::new(job, "failover", json!({})).unwrap();
        let payload = flotilla_contracts::json::encode(&request).unwrap();
        let key = job.to_string();
        let record = rdkafka::producer::FutureRecord::to(&fleet.topic)
            .partition(partition)
            .key(&key)
            .payload(&payload);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        jobs.push(job);
    }
    let pool = pool_to(primary).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let completed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_run WHERE job_id = ANY($1) AND status = 'COMPLETED'",
        )
        .bind(&jobs)
        .fetch_one(&pool)
        .await
        .unwrap();
        let kept: i64 =
            sqlx::query_scalar("SELECT count(*) FROM consumer_offset WHERE group_id = $1")
                .bind(&fleet.group)
                .fetch_one(&pool)
                .await
                .unwrap();
        if completed == i64::from(PARTITIONS) && kept == i64::from(PARTITIONS) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet never settled: {completed} of the warm-up jobs COMPLETED, {kept} partitions with an offset kept"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pool.close().await;
    jobs
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// A pool straight to `server` (not through the fleet's proxy).
async fn pool_to(address: std::net::SocketAddr) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(&ReplicatedPostgres::url(address, "postgres"))
        .await
        .unwrap()
}

/// What the failover left to count.
struct Figures {
    produced: usize,
    /// COMPLETED rows the primary showed just before it stopped, and the
    /// promoted standby's count of them.
    completed_on_primary: i64,
    completed_on_standby: i64,
    rows_on_primary: i64,
    rows_on_standby: i64,
    /// From the proxy pointing at the standby to the first job completed there.
    back_after: Duration,
    calls: usize,
    repeats: usize,
    /// Events read back, and jobs with more than one COMPLETED event id.
    events: usize,
    completed_twice: usize,
    rewinds: usize,
}

#[allow(clippy::too_many_lines)]
async fn fail_over(mode: Replication) {
    let mut postgres = ReplicatedPostgres::start(mode).await;
    let proxy = Proxy::start(postgres.primary.address()).await;
    let fleet_url = ReplicatedPostgres::url(proxy.address(), "postgres");
    {
        let pool = pool_to(postgres.primary.address()).await;
        flotilla_store::MIGRATOR.run(&pool).await.unwrap();
        pool.close().await;
    }

    let calls = Calls::default();
    let target = start_target(calls.clone()).await;
    let dir = std::env::temp_dir().join(format!("flotilla-failover-{}", Uuid::new_v4()));
    write_fleet_files(&dir, &target);
    let fleet = Arc::new(Fleet {
        dir: dir.clone(),
        bootstrap: flotilla_tests::bootstrap_servers(),
        topic: unique("failover-requests"),
        events: unique("failover-events"),
        group: unique("failover-workers"),
        database: fleet_url,
    });
    let dead_letters = flotilla_contracts::topics::dead_letter_topic(&fleet.topic);
    for topic in [&fleet.topic, &dead_letters, &fleet.events] {
        flotilla_tests::create_topic(topic, PARTITIONS)
            .await
            .unwrap();
    }
    let kafka = flotilla_runtime::BrokerConfig::new(&fleet.bootstrap);
    let (mut workers, mut relay) = {
        let fleet = fleet.clone();
        tokio::task::spawn_blocking(move || {
            let workers: Vec<Running> = (0..WORKERS)
                .map(|n| start(fleet.worker(n), "worker ready"))
                .collect();
            (workers, start(fleet.relay(), "relay ready"))
        })
        .await
        .unwrap()
    };

    // The group settled before the clock starts: one request on each
    // partition, each a COMPLETED row with its partition's offset kept,
    // so every partition has an offset in the database that the standby
    // receives long before the stall (a partition first read during the
    // stall would be a loss of another kind, read again from its start).
    let warm_up = warm_up(&kafka, &fleet, postgres.primary.address()).await;
    let producing = {
        let (kafka, topic) = (kafka.clone(), fleet.topic.clone());
        tokio::spawn(async move {
            let producer: rdkafka::producer::FutureProducer =
                kafka.acknowledged_producer().create().unwrap();
            let gap = PRODUCING / u32::try_from(REQUESTS).unwrap();
            let mut jobs = Vec::with_capacity(REQUESTS);
            let mut deliveries = Vec::with_capacity(REQUESTS);
            for _ in 0..REQUESTS {
                let job = Uuid::new_v4();
                let request = WorkflowRunRequest::new(job, "failover", json!({})).unwrap();
                let payload = flotilla_contracts::json::encode(&request).unwrap();
                let key = job.to_string();
                let record = rdkafka::producer::FutureRecord::to(&topic)
                    .key(&key)
                    .payload(&payload);
                deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
                jobs.push(job);
                tokio::time::sleep(gap).await;
            }
            for delivery in deliveries {
                delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
            jobs
        })
    };
    let started = Instant::now();

    // The stall (asynchronous only): the standby's WAL stream waits in
    // the link while the primary goes on committing.
    if mode == Replication::Asynchronous {
        tokio::time::sleep_until((started + STOP_AT - STALL).into()).await;
        postgres.link.hold();
    }
    tokio::time::sleep_until((started + STOP_AT).into()).await;
    let primary = pool_to(postgres.primary.address()).await;
    let rows_on_primary = count(&primary, "SELECT count(*) FROM workflow_run").await;
    let completed_on_primary = count(
        &primary,
        "SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'",
    )
    .await;
    primary.close().await;
    tokio::task::block_in_place(|| postgres.primary.stop_immediately());
    // What the link still held never reaches the standby.
    postgres.link.cut();
    // What the standby holds, read while no client of the fleet can reach
    // it yet (counted after its promotion, the fleet's first new rows were
    // counted too): once it has replayed all it received.
    let standby = pool_to(postgres.standby.address()).await;
    wait_for_replay(&standby).await;
    let rows_on_standby = count(&standby, "SELECT count(*) FROM workflow_run").await;
    let completed_on_standby = count(
        &standby,
        "SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'",
    )
    .await;
    // The service address moves to the standby, still read-only until
    // promoted: the fleet's writes are refused there for a moment.
    proxy.cut();
    proxy.repoint(postgres.standby.address());
    proxy.restore();
    tokio::task::block_in_place(|| postgres.standby.promote());
    let switched = Instant::now();

    // The fleet works again: a job completes on the new primary.
    let back_after = loop {
        let completed = count(
            &standby,
            "SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'",
        )
        .await;
        if completed > completed_on_standby {
            break switched.elapsed();
        }
        assert!(
            switched.elapsed() < Duration::from_secs(60),
            "no job completed on the promoted standby within a minute"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    let mut jobs = producing.await.unwrap();
    jobs.extend(warm_up);
    // Quiescence: every request a COMPLETED row, every event published.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let completed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_run WHERE job_id = ANY($1) AND status = 'COMPLETED'",
        )
        .bind(&jobs)
        .fetch_one(&standby)
        .await
        .unwrap();
        let pending = count(
            &standby,
            "SELECT count(*) FROM workflow_run_outbox_state WHERE status = 'PENDING'",
        )
        .await;
        if completed == i64::try_from(jobs.len()).unwrap() && pending == 0 {
            break;
        }
        if Instant::now() >= deadline {
            let states: Vec<(String, i64)> = sqlx::query_as(
                "SELECT status, count(*) FROM workflow_run WHERE job_id = ANY($1) GROUP BY status",
            )
            .bind(&jobs)
            .fetch_all(&standby)
            .await
            .unwrap();
            let offsets: Vec<(i32, i64)> =
                sqlx::query_as("SELECT partition, next_offset FROM consumer_offset ORDER BY 1")
                    .fetch_all(&standby)
                    .await
                    .unwrap();
            for (n, worker) in workers.iter_mut().enumerate() {
                for line in worker.output_so_far() {
                    // Problems, and the consumer's story (assignments,
                    // revocations, outages): which member held what, when.
                    if line.contains("WARN")
                        || line.contains("ERROR")
                        || line.contains("flotilla_ingest")
                    {
                        println!("worker {n}: {line}");
                    }
                }
            }
            panic!(
                "{completed} of {} jobs COMPLETED, {pending} events unpublished two minutes after the failover; rows by state {states:?}; the database's offsets {offsets:?}",
                jobs.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = count(&standby, "SELECT count(*) FROM workflow_run").await;
    assert_eq!(
        rows,
        i64::try_from(jobs.len()).unwrap(),
        "one row per request"
    );

    // Every job's COMPLETED event is on the event topic.
    let events = read_events(&kafka, &fleet.events).await;
    let mut completed_ids: HashMap<Uuid, HashSet<Uuid>> = HashMap::new();
    for event in &events {
        if event.event_type() == WorkflowRunEventType::Completed {
            completed_ids
                .entry(event.job_id())
                .or_default()
                .insert(event.event_id());
        }
    }
    let without: Vec<&Uuid> = jobs
        .iter()
        .filter(|job| !completed_ids.contains_key(job))
        .collect();
    assert!(
        without.is_empty(),
        "{} jobs have no COMPLETED event, e.g. {:?}",
        without.len(),
        without.first()
    );

    for worker in &mut workers {
        worker.terminate(Duration::from_secs(30));
    }
    relay.terminate(Duration::from_secs(30));
    // Every way a partition is read again: back to the database's offset
    // (a member that kept it, or a new one), resumed there where Kafka
    // has none, or from its start where the database lost it all.
    let rewinds = workers
        .iter()
        .flat_map(|worker| &worker.output)
        .filter(|line| {
            line.contains("reading those messages again")
                || line.contains("resuming at the database's")
                || line.contains("reading it again from its start")
        })
        .count();
    let calls = calls.0.lock().unwrap().clone();
    let figures = Figures {
        produced: jobs.len(),
        completed_on_primary,
        completed_on_standby,
        rows_on_primary,
        rows_on_standby,
        back_after,
        calls: calls.values().sum(),
        repeats: calls.values().map(|n| n - 1).sum(),
        events: events.len(),
        completed_twice: completed_ids.values().filter(|ids| ids.len() > 1).count(),
        rewinds,
    };
    println!(
        "failover ({mode:?}): {} requests produced, {rows} rows, every one COMPLETED with a COMPLETED event; \
         the primary showed {} rows ({} COMPLETED) just before its stop at {:.0} s, the promoted standby held {} ({}); \
         jobs completing again {:.2} s after the switch; {} step calls, {} repeats; {} events read, {} jobs published COMPLETED twice; \
         {} partitions read again",
        figures.produced,
        figures.rows_on_primary,
        figures.completed_on_primary,
        STOP_AT.as_secs_f64(),
        figures.rows_on_standby,
        figures.completed_on_standby,
        figures.back_after.as_secs_f64(),
        figures.calls,
        figures.repeats,
        figures.events,
        figures.completed_twice,
        figures.rewinds,
    );
    assert!(
        calls.keys().all(|key| key.ends_with(":one")),
        "every call carries its job's key: {:?}",
        calls.keys().find(|key| !key.ends_with(":one"))
    );
    match mode {
        Replication::Asynchronous => {
            // The scenario happened: the standby came up without commits
            // the primary had made, and some were read again.
            assert!(
                figures.rows_on_standby < figures.rows_on_primary,
                "the stall lost no row ({} on the primary, {} on the standby): the test did not test a loss",
                figures.rows_on_primary,
                figures.rows_on_standby
            );
            assert!(figures.rewinds > 0, "no partition was read again");
        }
        Replication::Synchronous => {
            assert!(
                figures.rows_on_standby >= figures.rows_on_primary
                    && figures.completed_on_standby >= figures.completed_on_primary,
                "synchronous replication lost acknowledged commits"
            );
            assert_eq!(
                figures.completed_twice, 0,
                "a job ran to its end twice under synchronous replication"
            );
            assert!(
                figures.repeats <= WORKERS * CLAIM_LOOPS,
                "{} repeated step calls: more than the {} jobs that can be in flight at the stop",
                figures.repeats,
                WORKERS * CLAIM_LOOPS
            );
        }
    }
    standby.close().await;
    drop(postgres);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every event of `topic`, from the start to the end each partition had
/// when the read began.
async fn read_events(kafka: &flotilla_runtime::BrokerConfig, topic: &str) -> Vec<WorkflowRunEvent> {
    let consumer: StreamConsumer = kafka
        .manual_commit_consumer(&unique("failover-reader"))
        .create()
        .unwrap();
    let mut assignment = rdkafka::TopicPartitionList::new();
    let mut ends = HashMap::new();
    for partition in 0..PARTITIONS {
        let (_, high) = consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(10))
            .unwrap();
        ends.insert(partition, high);
        assignment
            .add_partition_offset(topic, partition, rdkafka::Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut read: HashMap<i32, i64> = HashMap::new();
    let mut events = Vec::new();
    while ends
        .iter()
        .any(|(partition, end)| read.get(partition).copied().unwrap_or(0) < *end)
    {
        let message = consumer.recv().await.unwrap();
        read.insert(message.partition(), message.offset() + 1);
        let event: WorkflowRunEvent =
            flotilla_contracts::json::decode(message.payload().unwrap_or_default())
                .expect("an event the relay published decodes");
        events.push(event);
    }
    close_consumer(consumer);
    events
}

/// Waits until `standby` has replayed all it received that can be
/// replayed. Replay stops at the last whole WAL record: a record the cut
/// left half-sent counts as received and is never replayed, so "replayed
/// up to received" may never hold. Replay is also done once the startup
/// process waits for more WAL, seen twice 200 ms apart with replay not
/// moving between (a wait seen once may be the moment before a wake-up).
async fn wait_for_replay(standby: &sqlx::PgPool) {
    const DONE: &str = "SELECT pg_last_wal_replay_lsn()::text,
        pg_last_wal_receive_lsn() IS NULL
          OR pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()
          OR EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'startup'
                     AND wait_event IN ('RecoveryWalStream', 'RecoveryRetrieveRetryInterval'))";
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut idle_at: Option<Option<String>> = None;
    loop {
        let (replayed, done): (Option<String>, bool) =
            sqlx::query_as(DONE).fetch_one(standby).await.unwrap();
        match (&idle_at, done) {
            (Some(before), true) if *before == replayed => return,
            (_, true) => idle_at = Some(replayed),
            (_, false) => idle_at = None,
        }
        assert!(
            Instant::now() < deadline,
            "the standby never replayed what it received"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
