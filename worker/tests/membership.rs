//! Group membership on Apache Kafka under both consumer group protocols
//! (`FLOTILLA_GROUP_PROTOCOL`: classic, and KIP-848's consumer protocol):
//! a worker joining a group (scale-out), leaving it on SIGTERM (a rollout or
//! a scale-in), killed with SIGKILL (dynamic membership: its partitions move
//! after the session timeout), and killed and restarted with its id (static
//! membership, classic protocol: it gets its partitions back at once). Each
//! test times the
//! handover, from the event to the line in which a member says it was
//! assigned the partitions, prints it, and then checks that what is produced
//! afterwards becomes rows.
//!
//! The workers only ingest (no claim loops): rows stay QUEUED. Dynamic
//! members have a 10 s session under both protocols: classic ones ask for
//! it here, and the shared broker gives it to consumer-protocol members
//! (`scripts/kafka-node`).

use std::process::Command;
use std::time::{Duration, Instant};

use flotilla_tests::process::Running;
use flotilla_tests::{KAFKA_TEST_TIMEOUT, unique};
use sqlx::PgPool;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// Partitions of each test's request topic.
const PARTITIONS: i32 = 4;

/// The session a classic member asks for, as the shared broker gives
/// consumer-protocol members.
const CLASSIC_SESSION_MS: &str = "10000";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Classic,
    Consumer,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Consumer => "consumer",
        }
    }
}

/// One test's group: its topic, its workflow files, its database.
struct Group {
    dir: std::path::PathBuf,
    topic: String,
    group: String,
    database: String,
    protocol: Protocol,
}

impl Group {
    async fn new(pool: &PgPool, protocol: Protocol) -> Self {
        let dir = std::env::temp_dir().join(format!("flotilla-membership-{}", Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("workflows")).unwrap();
        let noop = serde_json::json!({"name": "noop", "input_schema": {},
            "steps": [{"name": "never", "target": "svc", "method": "m"}]});
        std::fs::write(dir.join("workflows/noop.json"), noop.to_string()).unwrap();
        std::fs::write(
            dir.join("targets.yaml"),
            "targets:\n  svc:\n    kind: http\n    base_url: http://127.0.0.1:1\n",
        )
        .unwrap();
        let topic = unique("membership-requests");
        flotilla_tests::create_topic(&topic, PARTITIONS)
            .await
            .unwrap();
        Self {
            dir,
            topic,
            group: unique("membership-workers"),
            database: flotilla_tests::database::url_of(pool).await,
            protocol,
        }
    }

    /// A worker that only ingests, with id `id`; a static member when
    /// `static_member`.
    fn worker(&self, id: &str, static_member: bool) -> Command {
        self.worker_speaking(id, static_member, self.protocol)
    }

    /// As [`Group::worker`], joining with `protocol`.
    fn worker_speaking(&self, id: &str, static_member: bool, protocol: Protocol) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
        command
            .env("DATABASE_URL", &self.database)
            .env(
                "KAFKA_BOOTSTRAP_SERVERS",
                flotilla_tests::bootstrap_servers(),
            )
            .env("SCHEMA_REGISTRY_URL", "")
            .env("FLOTILLA_WORKER_ID", id)
            .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
            .env("FLOTILLA_API_TOKENS", "t")
            .env("FLOTILLA_REQUEST_TOPIC", &self.topic)
            .env("FLOTILLA_CONSUMER_GROUP", &self.group)
            .env("FLOTILLA_GROUP_PROTOCOL", protocol.name())
            .env("FLOTILLA_STATIC_MEMBERSHIP", static_member.to_string())
            .env("FLOTILLA_WORKER_COUNT", "0")
            .env("FLOTILLA_WORKFLOWS_DIR", self.dir.join("workflows"))
            .env("FLOTILLA_TARGETS_FILE", self.dir.join("targets.yaml"))
            .env("NO_COLOR", "1");
        if protocol == Protocol::Classic && !static_member {
            command.args([
                "--kafka-property",
                &format!("session.timeout.ms={CLASSIC_SESSION_MS}"),
            ]);
        }
        command
    }

    /// Produces `count` requests, spread over every partition by their keys.
    async fn produce(&self, count: usize) {
        let producer: rdkafka::producer::FutureProducer = flotilla_tests::broker()
            .idempotent_producer()
            .create()
            .unwrap();
        for _ in 0..count {
            let request = flotilla_contracts::WorkflowRunRequest::new(
                Uuid::new_v4(),
                "noop",
                serde_json::json!({}),
            )
            .unwrap();
            let payload = flotilla_contracts::json::encode(&request).unwrap();
            let key = request.job_id().to_string();
            producer
                .send(
                    rdkafka::producer::FutureRecord::to(&self.topic)
                        .key(&key)
                        .payload(&payload),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn wait_rows(pool: &PgPool, expected: i64, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run")
            .fetch_one(pool)
            .await
            .unwrap();
        if rows >= expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{rows} rows of {expected}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start(command: Command) -> Running {
    flotilla_tests::process::started(command, "worker ready").await
}

/// Waits off the runtime until `member` says it was assigned partitions
/// of `topic` (a line printed after the call), and returns the member.
async fn assigned(mut member: Running, topic: &str, within: Duration) -> Running {
    let topic = format!("{topic}/");
    tokio::task::spawn_blocking(move || {
        member.wait_for_matching(
            "an assignment",
            |line| line.contains("partitions assigned") && line.contains(&topic),
            within,
        );
        member
    })
    .await
    .unwrap()
}

/// Drains what `member` printed so far, so the next wait sees only new lines.
fn settle(member: &mut Running) {
    let _ = member.output_so_far();
}

async fn terminate(member: Running) {
    let (status, member) = tokio::task::spawn_blocking(move || {
        let mut member = member;
        (member.terminate(Duration::from_secs(30)), member)
    })
    .await
    .unwrap();
    assert!(status.success(), "{}", member.output.join("\n"));
}

// Scale-out --------------------------------------------------------------------

async fn scale_out(pool: PgPool, protocol: Protocol) {
    let group = Group::new(&pool, protocol).await;
    let first = start(group.worker("first", false)).await;
    let mut first = assigned(first, &group.topic, Duration::from_secs(60)).await;
    group.produce(8).await;
    wait_rows(&pool, 8, Duration::from_secs(30)).await;
    settle(&mut first);

    let second = start(group.worker("second", false)).await;
    let joined = Instant::now();
    let second = assigned(second, &group.topic, Duration::from_secs(60)).await;
    let took = joined.elapsed();
    println!(
        "scale-out ({}): the newcomer held partitions {took:?} after it was ready",
        protocol.name()
    );
    group.produce(40).await;
    wait_rows(&pool, 48, Duration::from_secs(30)).await;
    terminate(second).await;
    terminate(first).await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_joining_a_group_takes_a_share_of_its_partitions_classic(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, scale_out(pool, Protocol::Classic))
        .await
        .expect("the scale-out test timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_joining_a_group_takes_a_share_of_its_partitions_consumer_protocol(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, scale_out(pool, Protocol::Consumer))
        .await
        .expect("the scale-out test timed out");
}

// Graceful scale-in and SIGKILL ------------------------------------------------

/// How the leaving member goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leaving {
    /// SIGTERM: it leaves the group on its way out.
    Gracefully,
    /// SIGKILL: the group hears of it only when its session times out.
    Killed,
}

async fn handover(pool: PgPool, protocol: Protocol, leaving: Leaving) {
    let group = Group::new(&pool, protocol).await;
    let staying = start(group.worker("staying", false)).await;
    let staying = assigned(staying, &group.topic, Duration::from_secs(60)).await;
    let leaver = start(group.worker("leaving", false)).await;
    let mut leaver = assigned(leaver, &group.topic, Duration::from_secs(60)).await;
    // Both members read: every partition's request became a row.
    group.produce(40).await;
    wait_rows(&pool, 40, Duration::from_secs(30)).await;
    let mut staying = staying;
    settle(&mut staying);

    let stopped = Instant::now();
    match leaving {
        Leaving::Gracefully => terminate(leaver).await,
        Leaving::Killed => leaver.kill(),
    }
    let staying = assigned(staying, &group.topic, Duration::from_secs(60)).await;
    let took = stopped.elapsed();
    println!(
        "{} ({}): the survivor held the leaver's partitions {took:?} after it {}",
        match leaving {
            Leaving::Gracefully => "graceful scale-in",
            Leaving::Killed => "SIGKILL",
        },
        protocol.name(),
        match leaving {
            Leaving::Gracefully => "was sent SIGTERM",
            Leaving::Killed => "was killed",
        },
    );
    if leaving == Leaving::Gracefully {
        // A member that leaves says so: no session timeout is waited for.
        assert!(took < Duration::from_secs(8), "{took:?}");
    }
    group.produce(40).await;
    wait_rows(&pool, 80, Duration::from_secs(30)).await;
    terminate(staying).await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_scaled_in_hands_its_partitions_over_at_once_classic(pool: PgPool) {
    tokio::time::timeout(
        KAFKA_TEST_TIMEOUT,
        handover(pool, Protocol::Classic, Leaving::Gracefully),
    )
    .await
    .expect("the scale-in test timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_scaled_in_hands_its_partitions_over_at_once_consumer_protocol(pool: PgPool) {
    tokio::time::timeout(
        KAFKA_TEST_TIMEOUT,
        handover(pool, Protocol::Consumer, Leaving::Gracefully),
    )
    .await
    .expect("the scale-in test timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_killed_workers_partitions_move_after_its_session_timeout_classic(pool: PgPool) {
    tokio::time::timeout(
        KAFKA_TEST_TIMEOUT,
        handover(pool, Protocol::Classic, Leaving::Killed),
    )
    .await
    .expect("the SIGKILL test timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_killed_workers_partitions_move_after_its_session_timeout_consumer_protocol(
    pool: PgPool,
) {
    tokio::time::timeout(
        KAFKA_TEST_TIMEOUT,
        handover(pool, Protocol::Consumer, Leaving::Killed),
    )
    .await
    .expect("the SIGKILL test timed out");
}

// Static membership ------------------------------------------------------------

async fn restart_with_id(pool: PgPool) {
    let protocol = Protocol::Classic;
    let group = Group::new(&pool, protocol).await;
    let first = start(group.worker("static-member", true)).await;
    let mut first = assigned(first, &group.topic, Duration::from_secs(60)).await;
    group.produce(6).await;
    wait_rows(&pool, 6, Duration::from_secs(30)).await;
    first.kill();

    group.produce(6).await;
    // (A worker restarted with its id first waits out its earlier self's
    // announcement in the database, `engine/src/services/membership.rs`: about 10 s.)
    let second = start(group.worker("static-member", true)).await;
    let ready = Instant::now();
    // Well inside the session timeout (librdkafka's 45 s for static
    // members here): no rebalance was waited for.
    wait_rows(&pool, 12, Duration::from_secs(5)).await;
    println!(
        "static member restarted ({}): its partitions read again {:?} after it was ready",
        protocol.name(),
        ready.elapsed()
    );
    terminate(second).await;
}

/// (Classic protocol only: under the consumer protocol static membership
/// is refused at start-up, `worker/tests/binary.rs`.)
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_killed_and_restarted_with_its_id_gets_its_partitions_back_classic(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, restart_with_id(pool))
        .await
        .expect("the static membership test timed out");
}

// Moving a fleet between the protocols ----------------------------------------

/// A fleet moved from the classic protocol to the consumer protocol: every
/// worker stopped (the group empties), then started under the consumer
/// protocol. Kafka converts the empty group and its committed offsets, and
/// the new members read on. (A rolling restart cannot do it: Kafka will not
/// convert a live classic group whose members use librdkafka's
/// cooperative-sticky assignor, whose user data it would lose, and a
/// consumer-protocol member that joins one waits without partitions; the
/// broker logs "Cannot upgrade classic group ... userData from a custom
/// assignor would be lost".)
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_fleet_stopped_and_started_under_the_consumer_protocol_reads_on(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let group = Group::new(&pool, Protocol::Classic).await;
        let first = start(group.worker("first", false)).await;
        let first = assigned(first, &group.topic, Duration::from_secs(60)).await;
        let second = start(group.worker("second", false)).await;
        let second = assigned(second, &group.topic, Duration::from_secs(60)).await;
        group.produce(20).await;
        wait_rows(&pool, 20, Duration::from_secs(30)).await;
        terminate(first).await;
        terminate(second).await;
        // The rows read so far are forgotten: were the group's committed
        // offsets lost in the conversion, the new members would read the
        // topic from its start and make them again.
        for table in ["workflow_run_outbox", "workflow_run"] {
            sqlx::query(&format!("DELETE FROM {table}"))
                .execute(&pool)
                .await
                .unwrap();
        }

        group.produce(20).await;
        let mut members = Vec::new();
        for id in ["first-again", "second-again"] {
            let member = start(group.worker_speaking(id, false, Protocol::Consumer)).await;
            members.push(assigned(member, &group.topic, Duration::from_secs(60)).await);
        }
        // Each partition is read in order: once the new requests are rows,
        // any older record the members read would be a row too.
        wait_rows(&pool, 20, Duration::from_secs(30)).await;
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(rows, 20, "requests read before the change were read again");
        group.produce(20).await;
        wait_rows(&pool, 40, Duration::from_secs(30)).await;
        for member in members {
            terminate(member).await;
        }
    })
    .await
    .expect("the protocol change timed out");
}
