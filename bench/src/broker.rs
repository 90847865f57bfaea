//! The broker alone, on what Flotilla asks of it: how soon a record produced
//! into an idle partition reaches a subscribed consumer, whether a member
//! killed with SIGKILL loses its partitions to the survivor (dynamic and
//! static membership), which compression codecs survive the round trip, and
//! how long an admin topic creation takes. Measured on Apache Kafka
//! (`KAFKA_BOOTSTRAP_SERVERS`, `scripts/services`) and on librdkafka's mock
//! cluster beside it; and how long a Kafka node of `scripts/kafka-node`
//! takes to serve, and its memory once it has.
//!
//! The killed member is this binary started again with `--group-member`
//! ([`serve_member`]): a process of its own, so SIGKILL is a real crash.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::Message as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _, StreamConsumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};

use crate::report::Report;

/// Partitions of the topic the fetch latency is measured on: most of them
/// idle at any moment, as a worker's request partitions are.
const FETCH_PARTITIONS: i32 = 6;
/// How long a killed member may keep its partitions before the figure
/// says "never" (the session timeout below, and then some).
const REASSIGNMENT_CAP: Duration = Duration::from_secs(45);
/// How long a joining member may wait for its share of the partitions.
const SPLIT_CAP: Duration = Duration::from_secs(60);
const SESSION_TIMEOUT_MS: &str = "6000";
/// Records stored before measuring the idle fetch again.
const FILL_RECORDS: usize = 50_000;
/// Records of the filled topic read back, each with its headers.
const READ_BACK: usize = 2_000;

/// Which broker, and how to make topics on it.
pub(crate) enum Broker {
    Kafka(String),
    Mock(MockCluster<'static, DefaultProducerContext>),
}

impl Broker {
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Kafka(_) => "Apache Kafka",
            Self::Mock(_) => "mock cluster",
        }
    }

    pub(crate) fn bootstrap(&self) -> String {
        match self {
            Self::Kafka(bootstrap) => bootstrap.clone(),
            Self::Mock(cluster) => cluster.bootstrap_servers(),
        }
    }

    /// A fresh topic; on Kafka through the admin API, timed.
    pub(crate) async fn topic(
        &self,
        prefix: &str,
        partitions: i32,
    ) -> anyhow::Result<(String, Duration)> {
        let name = flotilla_tests::unique(prefix);
        let started = Instant::now();
        match self {
            Self::Kafka(bootstrap) => {
                let admin: AdminClient<DefaultClientContext> =
                    flotilla_runtime::BrokerConfig::new(bootstrap)
                        .client()
                        .create()?;
                let topic = NewTopic::new(&name, partitions, TopicReplication::Fixed(1));
                for result in admin.create_topics([&topic], &AdminOptions::new()).await? {
                    result.map_err(|(topic, code)| anyhow::anyhow!("creating {topic}: {code}"))?;
                }
            }
            Self::Mock(cluster) => cluster.create_topic(&name, partitions, 1)?,
        }
        Ok((name, started.elapsed()))
    }
}

pub(crate) async fn run(report: &mut Report, smoke: bool) -> anyhow::Result<()> {
    start_up(report).await?;
    let brokers = [
        Broker::Kafka(flotilla_tests::bootstrap_servers()),
        Broker::Mock(MockCluster::new(1)?),
    ];
    for broker in &brokers {
        let label = broker.label();
        if let Broker::Kafka(_) = broker {
            let (_, took) = broker.topic("bench-broker-admin", FETCH_PARTITIONS).await?;
            report.add(
                "broker",
                format!("admin topic creation, {FETCH_PARTITIONS} partitions, {label}"),
                took.as_secs_f64() * 1e3,
                "ms",
            );
        }
        let samples = if smoke { 3 } else { 30 };
        for wait_ms in [500, 100] {
            let latencies = idle_partition_fetch(broker, wait_ms, samples).await?;
            let name = format!("idle partition → consumer, fetch.wait.max.ms={wait_ms}, {label}");
            latencies.report(report, &name);
        }
        if let (Broker::Kafka(_), false) = (broker, smoke) {
            // What a day of tests leaves behind: records with headers (the
            // relay's trace context), then the same measurement again.
            let filled = fill(broker, FILL_RECORDS).await?;
            let started = Instant::now();
            read_back(broker, &filled, READ_BACK).await?;
            report.add(
                "broker",
                format!(
                    "{READ_BACK} records with headers read back, {label} holding {FILL_RECORDS}"
                ),
                started.elapsed().as_secs_f64() * 1e3,
                "ms",
            );
            let latencies = idle_partition_fetch(broker, 100, samples).await?;
            let name = format!(
                "idle partition → consumer, fetch.wait.max.ms=100, {label} holding {FILL_RECORDS} more records with headers"
            );
            latencies.report(report, &name);
        }
        if !smoke {
            group_figures(report, broker).await;
        }
        for codec in ["gzip", "lz4", "zstd", "snappy"] {
            let survived = codec_round_trip(broker, codec).await;
            if let Err(error) = &survived {
                println!("bench: {codec} on the {label}: {error:#}");
            }
            let name = format!("{codec} round trip, {label} (1 = every record back)");
            report.add("broker", name, f64::from(u8::from(survived.is_ok())), "ok");
        }
    }
    Ok(())
}

/// A Kafka node of `scripts/kafka-node` (one KRaft process, the heap it
/// is given by default), from its start to serving, and its resident
/// memory then and after a topic's round trip.
async fn start_up(report: &mut Report) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("flotilla-bench-kafka-{}", uuid::Uuid::new_v4()));
    let started = Instant::now();
    let kafka = flotilla_tests::kafka::OwnKafka::started(
        &dir,
        flotilla_tests::kafka::KafkaOptions::default(),
    )
    .await;
    report.add(
        "broker",
        "Apache Kafka node (scripts/kafka-node): start to serving, storage formatted first",
        started.elapsed().as_secs_f64(),
        "s",
    );
    if let Some(kib) = kafka.resident_kib() {
        #[allow(clippy::cast_precision_loss)]
        report.add(
            "broker",
            "Apache Kafka node: resident memory once serving",
            kib as f64 / 1024.0,
            "MiB",
        );
    }
    drop(kafka);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A member joining a group whose one member holds every partition, and
/// a member killed with SIGKILL, with dynamic and with static membership.
async fn group_figures(report: &mut Report, broker: &Broker) {
    let label = broker.label();
    for static_membership in [false, true] {
        let membership = if static_membership {
            "static"
        } else {
            "dynamic"
        };
        let cap = REASSIGNMENT_CAP.as_secs();
        let (joined, moved) = match reassignment_after_kill(broker, static_membership).await {
            Ok((joined, moved)) => (
                joined.map_or(-1.0, |took| took.as_secs_f64()),
                moved.map_or(-1.0, |took| took.as_secs_f64()),
            ),
            Err(error) => {
                println!("bench: {membership} membership on the {label}: {error:#}");
                (-1.0, -1.0)
            }
        };
        report.add(
            "broker",
            format!(
                "a member joining a live one: the two partitions split, {membership} membership, {label} \
                 (session {SESSION_TIMEOUT_MS} ms; -1 = not within {} s)",
                SPLIT_CAP.as_secs()
            ),
            joined,
            "s",
        );
        report.add(
            "broker",
            format!(
                "SIGKILLed member's partition to the survivor, {membership} membership, {label} \
                 (session {SESSION_TIMEOUT_MS} ms; -1 = not within {cap} s)"
            ),
            moved,
            "s",
        );
    }
}

/// Records with two headers each, produced as fast as the broker takes them.
async fn fill(broker: &Broker, records: usize) -> anyhow::Result<String> {
    let (topic, _) = broker.topic("bench-broker-fill", FETCH_PARTITIONS).await?;
    let producer: FutureProducer = flotilla_runtime::BrokerConfig::new(&broker.bootstrap())
        .client()
        .set("linger.ms", "5")
        .create()?;
    let payload = "x".repeat(200);
    let mut sends = Vec::with_capacity(records);
    for n in 0..records {
        let key = n.to_string();
        let headers = rdkafka::message::OwnedHeaders::new()
            .insert(rdkafka::message::Header {
                key: "traceparent",
                value: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            })
            .insert(rdkafka::message::Header {
                key: "job_id",
                value: Some(key.as_str()),
            });
        let record = FutureRecord::to(&topic)
            .key(&key)
            .payload(&payload)
            .headers(headers);
        sends.push(producer.send_result(record).map_err(|(error, _)| error)?);
    }
    for send in sends {
        send.await?.map_err(|(error, _)| error)?;
    }
    Ok(topic)
}

/// The first `records` of `topic`, read by a new group from the start.
async fn read_back(broker: &Broker, topic: &str, records: usize) -> anyhow::Result<()> {
    let consumer: StreamConsumer =
        consumer_config(&broker.bootstrap(), &flotilla_tests::unique("bench")).create()?;
    consumer.subscribe(&[topic])?;
    for n in 0..records {
        tokio::time::timeout(Duration::from_secs(120), consumer.recv())
            .await
            .map_err(|_| anyhow::anyhow!("record {n} of {topic} not read within 120 s"))??;
    }
    Ok(())
}

/// Milliseconds, sorted.
struct Latencies(Vec<f64>);

impl Latencies {
    fn report(&self, report: &mut Report, name: &str) {
        report.add("broker", format!("{name}: p50"), self.percentile(50), "ms");
        report.add("broker", format!("{name}: max"), self.percentile(100), "ms");
    }

    fn percentile(&self, p: usize) -> f64 {
        let index = (self.0.len() * p).div_ceil(100).clamp(1, self.0.len()) - 1;
        self.0[index]
    }
}

/// A consumer in a group of its own, set up as Flotilla's own consumers
/// are (manual commits, from the earliest offset, read committed).
fn consumer_config(bootstrap: &str, group: &str) -> ClientConfig {
    flotilla_runtime::BrokerConfig::new(bootstrap).manual_commit_consumer(group)
}

/// Flotilla's idempotent producer, sending at once.
fn producer(bootstrap: &str, compression: &str) -> anyhow::Result<FutureProducer> {
    Ok(flotilla_runtime::BrokerConfig::new(bootstrap)
        .idempotent_producer()
        .set("linger.ms", "0")
        .set("compression.type", compression)
        .create()?)
}

/// One record at a time, each into the next partition of a topic whose
/// other partitions are idle, from just before the produce until the
/// subscribed consumer has it.
async fn idle_partition_fetch(
    broker: &Broker,
    wait_ms: u32,
    samples: usize,
) -> anyhow::Result<Latencies> {
    let bootstrap = broker.bootstrap();
    let (topic, _) = broker.topic("bench-broker-fetch", FETCH_PARTITIONS).await?;
    let consumer: StreamConsumer = consumer_config(&bootstrap, &flotilla_tests::unique("bench"))
        .set("fetch.wait.max.ms", wait_ms.to_string())
        .create()?;
    consumer.subscribe(&[&topic])?;
    let producer = producer(&bootstrap, "none")?;
    let deliver = |n: usize| {
        let (producer, topic) = (&producer, &topic);
        async move {
            let key = n.to_string();
            let partition = i32::try_from(n).unwrap_or(0) % FETCH_PARTITIONS;
            let record = FutureRecord::to(topic)
                .key(&key)
                .payload(&key)
                .partition(partition);
            producer
                .send(record, Duration::from_secs(30))
                .await
                .map_err(|(error, _)| anyhow::anyhow!("produce: {error}"))
        }
    };
    let receive = |n: usize| {
        let consumer = &consumer;
        async move {
            loop {
                let message = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
                    .await
                    .map_err(|_| anyhow::anyhow!("record {n} not fetched within 60 s"))??;
                if message.key() == Some(n.to_string().as_bytes()) {
                    return anyhow::Ok(());
                }
            }
        }
    };
    // The first record also waits for the group to form; not a sample.
    deliver(0).await?;
    receive(0).await?;
    let mut latencies = Vec::with_capacity(samples);
    for n in 1..=samples {
        // Let the consumer settle into its idle fetches first, so each
        // record lands in a partition nobody has had data from lately.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        let (delivered, received) = tokio::join!(deliver(n), receive(n));
        delivered?;
        received?;
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
    }
    latencies.sort_by(f64::total_cmp);
    Ok(Latencies(latencies))
}

/// Ten records produced with `codec` and every one read back.
async fn codec_round_trip(broker: &Broker, codec: &str) -> anyhow::Result<()> {
    let bootstrap = broker.bootstrap();
    let (topic, _) = broker.topic("bench-broker-codec", 1).await?;
    let producer = producer(&bootstrap, codec)?;
    for n in 0..10 {
        let payload = format!("{codec} record {n} {}", "x".repeat(200));
        producer
            .send(
                FutureRecord::to(&topic).key("k").payload(&payload),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(error, _)| anyhow::anyhow!("produce: {error}"))?;
    }
    let consumer: StreamConsumer =
        consumer_config(&bootstrap, &flotilla_tests::unique("bench")).create()?;
    consumer.subscribe(&[&topic])?;
    for n in 0..10 {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .map_err(|_| anyhow::anyhow!("record {n} not read within 30 s"))??;
        let expected = format!("{codec} record {n} ");
        anyhow::ensure!(
            message
                .payload()
                .is_some_and(|p| p.starts_with(expected.as_bytes())),
            "record {n} came back changed"
        );
    }
    Ok(())
}

fn member_config(bootstrap: &str, group: &str, instance: Option<&str>) -> ClientConfig {
    let mut config = consumer_config(bootstrap, group);
    config
        .set("session.timeout.ms", SESSION_TIMEOUT_MS)
        .set("heartbeat.interval.ms", "1000")
        .set("partition.assignment.strategy", "range");
    if let Some(instance) = instance {
        config.set("group.instance.id", instance);
    }
    config
}

/// What `--group-member` runs: join the group and hold whatever it is
/// given, saying `assigned` once it holds a partition, until killed.
pub(crate) fn serve_member(args: &[String]) -> anyhow::Result<()> {
    let [bootstrap, topic, group, instance] = args else {
        anyhow::bail!("--group-member takes bootstrap, topic, group and instance ('-' for none)");
    };
    let instance = (instance != "-").then_some(instance.as_str());
    let consumer: BaseConsumer = member_config(bootstrap, group, instance).create()?;
    consumer.subscribe(&[topic])?;
    let started = Instant::now();
    let mut said = false;
    loop {
        let _ = consumer.poll(Duration::from_millis(100));
        if !said && consumer.assignment()?.count() > 0 {
            println!("assigned");
            said = true;
        }
        // Never left behind: the measuring process kills this one well
        // before, or has given up on it.
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(180),
            "group member left running"
        );
    }
}

/// A member (another process) holds a two-partition topic; a second joins:
/// how long until each holds one (`None`: not within [`SPLIT_CAP`]). Then
/// the first is killed with SIGKILL: how long until the survivor holds
/// both (`None`: not within [`REASSIGNMENT_CAP`], or the split never came).
async fn reassignment_after_kill(
    broker: &Broker,
    static_membership: bool,
) -> anyhow::Result<(Option<Duration>, Option<Duration>)> {
    let bootstrap = broker.bootstrap();
    let (topic, _) = broker.topic("bench-broker-group", 2).await?;
    let group = flotilla_tests::unique("bench-group");
    tokio::task::spawn_blocking(move || {
        let mut victim = spawn_member(&bootstrap, &topic, &group, static_membership)?;
        let survivor_instance = static_membership.then(|| flotilla_tests::unique("survivor"));
        let survivor: BaseConsumer =
            member_config(&bootstrap, &group, survivor_instance.as_deref()).create()?;
        survivor.subscribe(&[&topic])?;
        let held = |survivor: &BaseConsumer| -> anyhow::Result<usize> {
            let _ = survivor.poll(Duration::from_millis(50));
            Ok(survivor.assignment()?.count())
        };
        // Both members hold one partition each before the kill.
        let joining = Instant::now();
        while held(&survivor)? != 1 {
            if joining.elapsed() > SPLIT_CAP {
                let _ = victim.kill();
                let _ = victim.wait();
                return Ok((None, None));
            }
        }
        let joined = joining.elapsed();
        victim.kill()?;
        victim.wait()?;
        let killed = Instant::now();
        while killed.elapsed() < REASSIGNMENT_CAP {
            if held(&survivor)? == 2 {
                return Ok((Some(joined), Some(killed.elapsed())));
            }
        }
        Ok((Some(joined), None))
    })
    .await?
}

/// This binary again as a group member, once it holds a partition (the
/// member gives up by itself, so the read below ends).
fn spawn_member(
    bootstrap: &str,
    topic: &str,
    group: &str,
    static_membership: bool,
) -> anyhow::Result<Child> {
    let instance = if static_membership {
        flotilla_tests::unique("victim")
    } else {
        "-".to_owned()
    };
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--group-member", bootstrap, topic, group, &instance])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    let read = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
    if read.is_err() || line.trim() != "assigned" {
        let _ = child.kill();
        anyhow::bail!("the group member never held a partition: {line:?}");
    }
    Ok(child)
}
