//! Broker faults: a three-broker cluster of the test's own (topics
//! replicated three times, `min.insync.replicas` 2) under two workers and
//! two relays, all at their defaults for Kafka, while jobs arrive: half of
//! them ask a Kafka target (a responder in the test) between two HTTP
//! steps, a quarter hold an HTTP step for seconds so their leases are
//! renewed while it runs. One fault at a time, the cluster whole again
//! before the next:
//!
//! 1. a broker SIGKILLed, restarted on its storage once events flow again;
//! 2. another frozen (SIGSTOP) past its session with the controllers, then
//!    released;
//! 3. the broker coordinating the workers' group killed while a third
//!    worker joins it (a rebalance under way), then restarted;
//! 4. a partition of the event topic given another leader by reassignment.
//!
//! At quiescence: a row per request and none twice, every job COMPLETED,
//! its events 1..k in one partition with no event id written twice (the
//! relay's idempotent producer) and no step request written twice, every
//! HTTP step called once (no lease lapsed, so no step ran twice), the
//! leases renewed on their cadence throughout (review finding K7: no
//! librdkafka wait on the workers' async threads), every process still
//! running with no operator action. Printed: seconds from each fault until
//! events flow again, and the copies written twice.
//!
//! CI runs it at three requests a second; `FLOTILLA_CHAOS_FULL=1` at eight,
//! over 1,000 jobs.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use flotilla_contracts::{
    WorkflowRunEvent, WorkflowRunEventType, WorkflowRunRequest, WorkflowStepReply,
    WorkflowStepRequest,
};
use flotilla_runtime::BrokerConfig;
use flotilla_tests::kafka::{self as kafka_admin, KafkaOptions, OwnKafkaCluster};
use flotilla_tests::process::Running;
use flotilla_tests::unique;
use rdkafka::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer as _, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{MIGRATOR, PARTITIONS, Recorder, quiesce, read_topics, start, start_target};

/// The workers' lease: renewed every quarter of it.
const LEASE: Duration = Duration::from_secs(6);

/// How long a slow job's step `two` takes: two renewals or more.
const SLOW_STEP: Duration = Duration::from_secs(4);

/// A quarter of the jobs hold step `two` for [`SLOW_STEP`].
fn slow(job: Uuid) -> bool {
    job.as_u128().is_multiple_of(4)
}

/// Half of the jobs run `brokered` (a Kafka step between two HTTP steps),
/// the others `direct` (three HTTP steps).
fn brokered(job: Uuid) -> bool {
    job.as_u128() % 2 == 1
}

/// Requests a second while the faults run, and at least how many.
fn pace() -> (u32, usize) {
    if std::env::var("FLOTILLA_CHAOS_FULL").is_ok_and(|v| v == "1") {
        (8, 1000)
    } else {
        (3, 200)
    }
}

/// The whole run's deadline, so a hang fails instead of eating CI.
const DEADLINE: Duration = Duration::from_secs(900);

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_fleet_rides_out_broker_kills_freezes_a_lost_coordinator_and_a_moved_leader(
    pool: PgPool,
) {
    tokio::time::timeout(DEADLINE, broker_faults(pool))
        .await
        .expect("the broker fault run timed out");
}

/// The run's topics and files.
struct Setup {
    dir: PathBuf,
    bootstrap: String,
    database: String,
    requests: String,
    events: String,
    asks: String,
    answers: String,
    group: String,
}

impl Setup {
    fn worker(&self, n: usize) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
        command
            .env("DATABASE_URL", &self.database)
            .env("KAFKA_BOOTSTRAP_SERVERS", &self.bootstrap)
            .env_remove("SCHEMA_REGISTRY_URL")
            .env("FLOTILLA_WORKER_ID", format!("faults-worker-{n}"))
            .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
            .env("FLOTILLA_API_TOKENS", "faults")
            .env("FLOTILLA_REQUEST_TOPIC", &self.requests)
            .env("FLOTILLA_CONSUMER_GROUP", &self.group)
            .env("FLOTILLA_TARGETS_FILE", self.dir.join("targets.yaml"))
            .env("FLOTILLA_WORKFLOWS_DIR", self.dir.join("workflows"))
            .env("FLOTILLA_LEASE", format!("{}s", LEASE.as_secs()))
            .env("FLOTILLA_SWEEP_INTERVAL", "1s")
            .env("FLOTILLA_CREATE_TOPICS", "false")
            // No signal topic: signals are not part of this run.
            .env("FLOTILLA_SIGNAL_TOPIC", "")
            .env("NO_COLOR", "1");
        command
    }

    fn relay(&self, n: usize) -> Command {
        let mut command = Command::new(flotilla_tests::process::workspace_binary("flotilla-relay"));
        command
            .env("DATABASE_URL", &self.database)
            .env("KAFKA_BOOTSTRAP_SERVERS", &self.bootstrap)
            .env_remove("SCHEMA_REGISTRY_URL")
            .env("FLOTILLA_EVENT_TOPIC", &self.events)
            .env("FLOTILLA_RELAY_ID", format!("faults-relay-{n}"))
            .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0")
            .env("FLOTILLA_RELAY_IDLE_POLL_MAX", "50ms")
            .env("FLOTILLA_CREATE_TOPICS", "false")
            .env("NO_COLOR", "1");
        command
    }

    fn topics(&self) -> Vec<String> {
        let dead = flotilla_contracts::topics::dead_letter_topic;
        vec![
            self.requests.clone(),
            dead(&self.requests),
            self.events.clone(),
            self.asks.clone(),
            self.answers.clone(),
            dead(&self.answers),
        ]
    }
}

fn write_files(dir: &Path, target: &str, asks: &str, answers: &str) {
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        format!(
            "targets:\n  rec:\n    kind: http\n    base_url: {target}\n    timeout_ms: 10000\n  scorer:\n    kind: kafka\n    request_topic: {asks}\n    reply_topic: {answers}\n    timeout_ms: 60000\n"
        ),
    )
    .unwrap();
    let rules = json!(["job = input.job", "fail = input.fail"]);
    let input_schema = json!({"type": "object", "required": ["job", "fail"],
        "properties": {"job": {"type": "string"}, "fail": {"type": "boolean"}}});
    let step = |name: &str| json!({"name": name, "target": "rec", "method": name, "rules": rules});
    let direct = json!({"name": "direct", "max_attempts": 6, "input_schema": input_schema,
        "steps": [step("one"), step("two"), step("three")]});
    let brokered = json!({"name": "brokered", "max_attempts": 6, "input_schema": input_schema,
        "steps": [step("one"),
                  {"name": "ask", "target": "scorer", "method": "score", "rules": ["job = input.job"]},
                  step("two")]});
    for workflow in [direct, brokered] {
        let name = workflow["name"].as_str().unwrap().to_owned();
        std::fs::write(
            dir.join(format!("workflows/{name}.json")),
            workflow.to_string(),
        )
        .unwrap();
    }
}

/// The service behind the Kafka target: answers every request it reads, in
/// a group of its own, with an idempotent producer.
fn responder(
    kafka: &BrokerConfig,
    asks: &str,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let consumer: StreamConsumer = kafka
        .manual_commit_consumer(&unique("faults-scorer"))
        .set("enable.auto.commit", "true")
        .create()
        .unwrap();
    consumer.subscribe(&[asks]).unwrap();
    let producer: FutureProducer = kafka.idempotent_producer().create().unwrap();
    tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                () = stop.cancelled() => break,
                message = consumer.recv() => message,
            };
            let Ok(message) = message else { continue };
            let Some(Ok(request)) = message
                .payload()
                .map(flotilla_contracts::json::decode::<WorkflowStepRequest>)
            else {
                continue;
            };
            let reply = WorkflowStepReply::answer(
                request.job_id(),
                request.correlation_id(),
                json!({"score": 1}),
            )
            .unwrap();
            let payload = flotilla_contracts::json::encode(&reply).unwrap();
            let key = request.job_id().to_string();
            let record = FutureRecord::to(request.reply_topic())
                .key(&key)
                .payload(&payload);
            // Retried by the producer until its delivery timeout; a reply
            // lost past that would time the step out, which the run reports.
            let _ = producer.send(record, Duration::from_secs(120)).await;
        }
        flotilla_tests::close_consumer(consumer);
    })
}

/// When each event was read by a consumer outside any group, as a user's
/// reader sees them: the gaps say how long events stopped flowing.
fn event_watch(
    kafka: &BrokerConfig,
    events: &str,
    stop: CancellationToken,
) -> (Arc<Mutex<Vec<Instant>>>, tokio::task::JoinHandle<()>) {
    let consumer: StreamConsumer = kafka
        .manual_commit_consumer(&unique("faults-watch"))
        .create()
        .unwrap();
    let mut assignment = rdkafka::TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        assignment
            .add_partition_offset(events, partition, rdkafka::Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                message = consumer.recv() => if message.is_ok() {
                    record.lock().unwrap().push(Instant::now());
                },
            }
        }
        flotilla_tests::close_consumer(consumer);
    });
    (seen, task)
}

/// The longest pause in the events' arrival within a minute after `fault`:
/// when it began and when events flowed again, in seconds after the fault.
fn pause_after(arrivals: &[Instant], fault: Instant) -> (f64, f64) {
    let mut last = fault;
    let mut longest = (Duration::ZERO, fault, fault);
    for at in arrivals
        .iter()
        .copied()
        .filter(|at| *at > fault && *at < fault + Duration::from_secs(60))
    {
        if at - last > longest.0 {
            longest = (at - last, last, at);
        }
        last = at;
    }
    (
        (longest.1 - fault).as_secs_f64(),
        (longest.2 - fault).as_secs_f64(),
    )
}

/// What the lease watch saw of running jobs.
#[derive(Default)]
struct Leases {
    /// Per job: the last `lease_until` seen and when (the database's clock).
    last: HashMap<Uuid, (DateTime<Utc>, DateTime<Utc>)>,
    /// The longest time between two renewals of a lease seen running.
    longest_renewal_gap: Duration,
    renewals: u64,
    /// Samples of a RUNNING row whose lease had run out.
    lapsed: Vec<(Uuid, DateTime<Utc>, DateTime<Utc>)>,
}

/// Samples the running rows' leases every 200 ms until `stop`.
fn lease_watch(pool: PgPool, stop: CancellationToken) -> tokio::task::JoinHandle<Leases> {
    tokio::spawn(async move {
        let mut leases = Leases::default();
        let mut previous_sample: Option<DateTime<Utc>> = None;
        while !stop.is_cancelled() {
            let rows: Vec<(Uuid, DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
                "SELECT job_id, lease_until, now() FROM workflow_run
                 WHERE status = 'RUNNING' AND lease_until IS NOT NULL",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            let sampled_at = rows.first().map(|row| row.2);
            // Two renewals apart count only between samples close together:
            // after a pause of the watch itself, renewals in between went unseen.
            let close = matches!((previous_sample, sampled_at),
                (Some(before), Some(now)) if now - before < chrono::TimeDelta::milliseconds(600));
            let mut seen = HashMap::new();
            for (job, lease_until, now) in rows {
                if lease_until < now {
                    leases.lapsed.push((job, lease_until, now));
                }
                if let Some((before, _)) = leases.last.get(&job)
                    && close
                    && lease_until > *before
                {
                    leases.renewals += 1;
                    let gap = (lease_until - *before).to_std().unwrap_or_default();
                    leases.longest_renewal_gap = leases.longest_renewal_gap.max(gap);
                }
                seen.insert(job, (lease_until, now));
            }
            // A job not running in this sample starts afresh when it runs again.
            leases.last = seen;
            if sampled_at.is_some() {
                previous_sample = sampled_at;
            } else {
                previous_sample = None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        leases
    })
}

/// The place of node `id` (Kafka numbers them from 1) among the cluster's.
fn node_index(id: u32) -> usize {
    usize::try_from(id).unwrap() - 1
}

/// Kills node `id` if it runs and starts it again on its storage.
async fn restart(cluster: &mut OwnKafkaCluster, id: u32) {
    let index = node_index(id);
    let node = cluster.nodes.remove(index);
    cluster.nodes.insert(index, node.restarted().await);
}

/// Polls until every partition of `topics` has its three replicas in sync.
async fn whole_again(kafka: &BrokerConfig, topics: &[String]) -> Duration {
    let (kafka, topics) = (kafka.clone(), topics.to_vec());
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = kafka
            .manual_commit_consumer(&unique("faults-isr"))
            .create()
            .unwrap();
        let began = Instant::now();
        loop {
            let short: Vec<String> = topics
                .iter()
                .flat_map(|topic| {
                    let metadata = client.fetch_metadata(Some(topic), Duration::from_secs(10));
                    match metadata {
                        Ok(metadata) => metadata.topics()[0]
                            .partitions()
                            .iter()
                            .filter(|p| p.isr().len() < 3)
                            .map(|p| format!("{topic}/{} isr {:?}", p.id(), p.isr()))
                            .collect(),
                        Err(e) => vec![format!("{topic}: {e}")],
                    }
                })
                .collect();
            if short.is_empty() {
                std::thread::spawn(move || drop(client));
                return began.elapsed();
            }
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "the cluster is not whole again after two minutes: {short:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    })
    .await
    .unwrap()
}

/// The node leading `partition` of `topic`.
async fn leader_of(kafka: &BrokerConfig, topic: &str, partition: i32) -> u32 {
    let (kafka, topic) = (kafka.clone(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = kafka
            .manual_commit_consumer(&unique("faults-leader"))
            .create()
            .unwrap();
        let metadata = client
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .unwrap();
        let leader =
            metadata.topics()[0].partitions()[usize::try_from(partition).unwrap()].leader();
        std::thread::spawn(move || drop(client));
        u32::try_from(leader).expect("a leader")
    })
    .await
    .unwrap()
}

/// Waits until events have flowed for a while after `fault` (a pause that
/// ended, then at least `flowing` of steady arrivals), at most a minute.
async fn flowing_again(arrivals: &Mutex<Vec<Instant>>, fault: Instant) {
    let deadline = fault + Duration::from_secs(60);
    loop {
        let steady = {
            let seen = arrivals.lock().unwrap();
            let after: Vec<Instant> = seen.iter().copied().filter(|at| *at > fault).collect();
            // Ten arrivals in the last two seconds, none a second apart.
            after.len() >= 10
                && after[after.len() - 10..]
                    .windows(2)
                    .all(|pair| pair[1] - pair[0] < Duration::from_secs(1))
                && Instant::now() - after[after.len() - 1] < Duration::from_secs(1)
        };
        if steady || Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[allow(clippy::too_many_lines)]
async fn broker_faults(pool: PgPool) {
    let recorder = Recorder {
        slow: Some((slow, SLOW_STEP)),
        ..Recorder::default()
    };
    let target = start_target(recorder.clone()).await;
    let dir = std::env::temp_dir().join(format!("flotilla-broker-faults-{}", Uuid::new_v4()));
    let mut cluster = OwnKafkaCluster::started(&dir, 3, KafkaOptions::default()).await;
    let setup = Arc::new(Setup {
        bootstrap: cluster.bootstrap.clone(),
        database: flotilla_tests::database::url_of(&pool).await,
        requests: unique("faults-requests"),
        events: unique("faults-events"),
        asks: unique("faults-asks"),
        answers: unique("faults-answers"),
        group: unique("faults-workers"),
        dir: dir.clone(),
    });
    write_files(&dir, &target, &setup.asks, &setup.answers);
    let kafka = BrokerConfig::new(&setup.bootstrap);
    let topics = setup.topics();
    let layout = flotilla_runtime::kafka::TopicLayout {
        create_topics: true,
        topic_partitions: PARTITIONS,
        topic_replication: 3,
        topic_min_insync_replicas: 2,
    };
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    flotilla_runtime::kafka::ensure_topics(&kafka, &names, layout)
        .await
        .unwrap();

    let stop = CancellationToken::new();
    let responder = responder(&kafka, &setup.asks, stop.clone());
    let (arrivals, watch) = event_watch(&kafka, &setup.events, stop.clone());
    let leases = lease_watch(pool.clone(), stop.clone());
    let (mut workers, mut relays) = {
        let setup = setup.clone();
        tokio::task::spawn_blocking(move || {
            let workers: Vec<Running> = (0..2)
                .map(|n| start(setup.worker(n), "worker ready"))
                .collect();
            let relays: Vec<Running> = (0..2)
                .map(|n| start(setup.relay(n), "relay ready"))
                .collect();
            (workers, relays)
        })
        .await
        .unwrap()
    };

    // Requests at an even pace until the faults are over and enough were sent.
    let faults_over = CancellationToken::new();
    let producer = {
        let (kafka, topic, faults_over) =
            (kafka.clone(), setup.requests.clone(), faults_over.clone());
        tokio::spawn(async move {
            let (per_second, at_least) = pace();
            let producer: FutureProducer = kafka.idempotent_producer().create().unwrap();
            let mut sent = Vec::new();
            let mut deliveries = Vec::new();
            let mut ticks = tokio::time::interval(Duration::from_secs(1) / per_second);
            while sent.len() < at_least || !faults_over.is_cancelled() {
                ticks.tick().await;
                let job = Uuid::new_v4();
                let workflow = if brokered(job) { "brokered" } else { "direct" };
                let input = json!({"job": job.to_string(), "fail": false});
                let request = WorkflowRunRequest::new(job, workflow, input).unwrap();
                let payload = flotilla_contracts::json::encode(&request).unwrap();
                let key = job.to_string();
                let record = FutureRecord::to(&topic).key(&key).payload(&payload);
                deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
                sent.push(job);
            }
            for delivery in deliveries {
                delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
            sent
        })
    };

    let mut figures: Vec<(String, (f64, f64))> = Vec::new();
    let settle = Duration::from_secs(10);
    tokio::time::sleep(settle).await; // traffic in full flow before the first fault

    // 1. A broker killed; restarted on its storage once events flow again.
    let killed = leader_of(&kafka, &setup.events, 0).await;
    let at = Instant::now();
    cluster.nodes[node_index(killed)].kill();
    flowing_again(&arrivals, at).await;
    restart(&mut cluster, killed).await;
    let whole = whole_again(&kafka, &topics).await;
    figures.push((
        format!("broker {killed} SIGKILLed (restarted, whole again {whole:.1?} after)"),
        pause_after(&arrivals.lock().unwrap(), at),
    ));
    tokio::time::sleep(settle).await;

    // 2. Another frozen past its session with the controllers, released.
    let frozen = if killed == 1 { 2 } else { 1 };
    let at = Instant::now();
    cluster.nodes[node_index(frozen)].freeze();
    tokio::time::sleep(Duration::from_secs(15)).await; // broker.session.timeout.ms is 9 s
    cluster.nodes[node_index(frozen)].thaw();
    flowing_again(&arrivals, at).await;
    let whole = whole_again(&kafka, &topics).await;
    figures.push((
        format!("broker {frozen} frozen 15 s (whole again {whole:.1?} after release)"),
        pause_after(&arrivals.lock().unwrap(), at),
    ));
    tokio::time::sleep(settle).await;

    // 3. The group's coordinator killed while a third worker joins.
    let coordinator = {
        let (bootstrap, group) = (setup.bootstrap.clone(), setup.group.clone());
        tokio::task::spawn_blocking(move || kafka_admin::coordinator_of(&bootstrap, &group))
            .await
            .unwrap()
    };
    let joining = {
        let setup = setup.clone();
        tokio::task::spawn_blocking(move || start(setup.worker(2), "worker ready"))
    };
    let joined = joining.await.unwrap();
    let at = Instant::now();
    cluster.nodes[node_index(coordinator)].kill();
    workers.push(joined);
    flowing_again(&arrivals, at).await;
    restart(&mut cluster, coordinator).await;
    let whole = whole_again(&kafka, &topics).await;
    figures.push((format!("coordinator broker {coordinator} SIGKILLed as a worker joined (restarted, whole again {whole:.1?} after)"), pause_after(&arrivals.lock().unwrap(), at)));
    tokio::time::sleep(settle).await;

    // 4. A partition's leadership moved by reassignment.
    let at = Instant::now();
    let (from, to) = {
        let (bootstrap, events) = (setup.bootstrap.clone(), setup.events.clone());
        tokio::task::spawn_blocking(move || kafka_admin::move_leader(&bootstrap, &events, 1))
            .await
            .unwrap()
    };
    flowing_again(&arrivals, at).await;
    figures.push((
        format!(
            "leader of {}/1 moved from broker {from} to {to}",
            setup.events
        ),
        pause_after(&arrivals.lock().unwrap(), at),
    ));
    faults_over.cancel();

    let sent: Vec<Uuid> = producer.await.unwrap();
    let produced: HashSet<Uuid> = sent.iter().copied().collect();
    assert_eq!(produced.len(), sent.len(), "distinct job ids produced");

    quiesce(&pool, produced.len(), Duration::from_secs(180)).await;
    stop.cancel();
    let leases = leases.await.unwrap();
    responder.await.unwrap();
    watch.await.unwrap();

    let rows: Vec<(Uuid, String, i64)> =
        sqlx::query_as("SELECT job_id, status, event_sequence FROM workflow_run")
            .fetch_all(&pool)
            .await
            .unwrap();
    let records = read_topics(&kafka, &[&setup.events, &setup.asks]).await;
    let mut streams: HashMap<Uuid, Vec<(i64, WorkflowRunEventType)>> = HashMap::new();
    let mut partitions_per_job: HashMap<Uuid, HashSet<i32>> = HashMap::new();
    let mut event_ids = HashSet::new();
    let (mut events_delivered, mut asks_delivered) = (0usize, 0usize);
    let mut correlation_ids = HashSet::new();
    let mut asked_jobs = HashSet::new();
    for record in &records {
        if record.topic == setup.asks {
            let request: WorkflowStepRequest =
                flotilla_contracts::json::decode(&record.payload).unwrap();
            asks_delivered += 1;
            correlation_ids.insert(request.correlation_id());
            asked_jobs.insert(request.job_id());
            continue;
        }
        events_delivered += 1;
        let event: WorkflowRunEvent = flotilla_contracts::json::decode(&record.payload).unwrap();
        partitions_per_job
            .entry(event.job_id())
            .or_default()
            .insert(record.partition);
        if event_ids.insert(event.event_id()) {
            streams
                .entry(event.job_id())
                .or_default()
                .push((event.sequence(), event.event_type()));
        }
    }
    let calls = recorder.calls.lock().unwrap().clone();
    let repeated_calls: Vec<&(Uuid, String)> = calls
        .iter()
        .filter(|(_, seen)| seen.len() > 1)
        .map(|(at, _)| at)
        .collect();
    let exited: Vec<String> = workers
        .iter_mut()
        .chain(relays.iter_mut())
        .filter_map(|running| running.exited().map(|status| status.to_string()))
        .collect();

    println!(
        "broker faults (three KRaft brokers, replication 3, min.insync.replicas 2; {} requests, half with a Kafka step):",
        produced.len()
    );
    for (what, (paused, flowing)) in &figures {
        println!(
            "  {what}: the longest pause in events {:.1} s, from {paused:.1} s to {flowing:.1} s after",
            flowing - paused
        );
    }
    println!(
        "  events: {} distinct, {events_delivered} delivered, written twice {}; step requests: {} distinct, {asks_delivered} delivered, written twice {}",
        event_ids.len(),
        events_delivered - event_ids.len(),
        correlation_ids.len(),
        asks_delivered - correlation_ids.len()
    );
    println!(
        "  leases: {} renewals seen, longest between two {:.1?} (every {:?}), lapsed {}; HTTP steps called twice: {}",
        leases.renewals,
        leases.longest_renewal_gap,
        LEASE / 4,
        leases.lapsed.len(),
        repeated_calls.len()
    );

    for (name, running) in [("relay", &mut relays), ("worker", &mut workers)] {
        let warnings: Vec<String> = running
            .iter_mut()
            .flat_map(|running| running.output_so_far().to_vec())
            .filter(|line| line.contains("WARN") || line.contains("ERROR"))
            .collect();
        println!("  {name} warnings: {}", warnings.len());
        for line in warnings.iter().take(40) {
            println!("    {line}");
        }
    }

    // Rows: one per request.
    assert_eq!(
        rows.len(),
        produced.len(),
        "one row per request, none twice"
    );
    let by_job: HashMap<Uuid, (String, i64)> = rows
        .iter()
        .map(|(job, status, k)| (*job, (status.clone(), *k)))
        .collect();
    assert_eq!(
        by_job.keys().copied().collect::<HashSet<_>>(),
        produced,
        "rows are the requests produced"
    );
    for (job, (status, _)) in &by_job {
        assert_eq!(status, "COMPLETED", "job {job}");
    }
    // Events: every one on the topic once, per job 1..k in one partition.
    assert_eq!(events_delivered, event_ids.len(), "no event written twice");
    for (job, (_, k)) in &by_job {
        let got: Vec<i64> = streams
            .get(job)
            .map(|s| s.iter().map(|(n, _)| *n).collect())
            .unwrap_or_default();
        assert_eq!(
            got,
            (1..=*k).collect::<Vec<_>>(),
            "job {job}: events 1..k in order"
        );
        assert_eq!(partitions_per_job[job].len(), 1, "job {job}: one partition");
        assert_eq!(
            streams[job].last().map(|(_, t)| *t),
            Some(WorkflowRunEventType::Completed)
        );
    }
    // Step requests: each brokered job asked, none written twice.
    assert_eq!(
        asks_delivered,
        correlation_ids.len(),
        "no step request written twice"
    );
    let brokered_jobs: HashSet<Uuid> = produced
        .iter()
        .copied()
        .filter(|job| brokered(*job))
        .collect();
    assert_eq!(
        asked_jobs, brokered_jobs,
        "every brokered job asked its Kafka target"
    );
    // Steps and leases: nothing ran twice, no lease lapsed, renewals on cadence.
    assert!(
        repeated_calls.is_empty(),
        "HTTP steps called more than once: {repeated_calls:?}"
    );
    assert!(
        leases.lapsed.is_empty(),
        "running rows whose lease ran out: {:?}",
        leases.lapsed
    );
    assert!(
        leases.renewals > 0,
        "the slow steps' leases were seen renewed"
    );
    assert!(
        leases.longest_renewal_gap <= LEASE / 2,
        "a lease went {:?} between renewals (every {:?} expected)",
        leases.longest_renewal_gap,
        LEASE / 4
    );
    assert!(exited.is_empty(), "processes exited: {exited:?}");

    let stop_all = |mut running: Running| {
        running.terminate(Duration::from_secs(30));
    };
    tokio::task::spawn_blocking(move || workers.into_iter().chain(relays).for_each(stop_all))
        .await
        .unwrap();
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
