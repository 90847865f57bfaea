//! What a Kafka transaction per page would cost the relay (the design for
//! events exactly once in bench/README.md): records/s producing pages of the
//! relay's size to a topic of the event topic's shape, each page awaited
//! before the next, as the relay sends them, with the idempotent producer
//! the relay uses now and with a transactional one committing every page;
//! on Apache Kafka (`KAFKA_BOOTSTRAP_SERVERS`) and on the mock cluster.

use std::time::{Duration, Instant};

use rdkafka::mocking::MockCluster;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rdkafka::ClientContext;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _, ProducerContext};
use uuid::Uuid;

use crate::broker::Broker;
use crate::report::Report;

/// The event topic's partitions in the chart's default.
const PARTITIONS: i32 = 12;
/// The relay's default page (`FLOTILLA_RELAY_BATCH_SIZE`).
const PAGE: usize = 500;
/// About a compact STEP_CHECKPOINT event with its header.
const RECORD_BYTES: usize = 200;
/// Longest wait for the transaction coordinator or a commit.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// How the pages are produced.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// The idempotent producer, as the relay sends now.
    Plain,
    /// A transaction committed per page.
    Transactional,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Self::Plain => "idempotent, no transaction",
            Self::Transactional => "a transaction per page",
        }
    }
}

pub(crate) async fn run(report: &mut Report, smoke: bool) -> anyhow::Result<()> {
    let records = if smoke { 2_000 } else { 100_000 };
    let brokers = [
        Broker::Kafka(flotilla_tests::bootstrap_servers()),
        Broker::Mock(MockCluster::new(1)?),
    ];
    for broker in &brokers {
        let label = broker.label();
        let mut plain = None;
        for mode in [Mode::Plain, Mode::Transactional] {
            let (topic, _) = broker.topic("bench-transactions", PARTITIONS).await?;
            let pages = produce(&broker.bootstrap(), &topic, records, mode).await?;
            let kind = mode.label();
            report.add(
                "transactions",
                format!("{records} records in pages of {PAGE}, {kind}, {label}"),
                pages.rate,
                "records/s",
            );
            if let Some(commit) = pages.commit_p50 {
                report.add(
                    "transactions",
                    format!("commit of a page p50, {kind}, {label}"),
                    commit.as_secs_f64() * 1e3,
                    "ms",
                );
            }
            match plain {
                None => plain = Some(pages.rate),
                Some(plain) => report.add(
                    "transactions",
                    format!("{kind} / none, {label}"),
                    pages.rate / plain,
                    "ratio",
                ),
            }
        }
    }
    Ok(())
}

/// Counts the records answered and those refused.
#[derive(Clone, Default)]
struct Answers {
    answered: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

impl ClientContext for Answers {}

impl ProducerContext for Answers {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, (): Self::DeliveryOpaque) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        if result.is_err() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How one producer did.
struct Pages {
    rate: f64,
    commit_p50: Option<Duration>,
}

/// Produces `records` to `topic` in pages, each acknowledged (flushed, or,
/// in a transactional `mode`, committed) before the next goes, keyed by
/// random job ids as the relay keys events. The page's answers are polled
/// for every millisecond before the commit: librdkafka's flush (which
/// `commit_transaction` calls) waits in steps of 100 ms, and every commit
/// and every flushed page took 100 ms that way, on either broker, with or
/// without a transaction.
async fn produce(
    bootstrap: &str,
    topic: &str,
    records: usize,
    mode: Mode,
) -> anyhow::Result<Pages> {
    let transactional = mode != Mode::Plain;
    let mut config = flotilla_runtime::BrokerConfig::new(bootstrap).idempotent_producer();
    config.set("queue.buffering.max.ms", "5");
    if transactional {
        config.set(
            "transactional.id",
            format!("flotilla-bench-{}", Uuid::new_v4().simple()),
        );
    }
    let answers = Answers::default();
    let producer: BaseProducer<Answers> = config.create_with_context(answers.clone())?;
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Pages> {
        if transactional {
            producer.init_transactions(TRANSACTION_TIMEOUT)?;
        }
        let payload = vec![b'x'; RECORD_BYTES];
        let mut commits = Vec::new();
        let mut sent = 0;
        let started = Instant::now();
        for _ in 0..records.div_ceil(PAGE) {
            if transactional {
                producer.begin_transaction()?;
            }
            for _ in 0..PAGE {
                let key = Uuid::new_v4().to_string();
                producer
                    .send(BaseRecord::to(&topic).key(&key).payload(&payload))
                    .map_err(|(e, _)| e)?;
            }
            sent += PAGE;
            let deadline = Instant::now() + TRANSACTION_TIMEOUT;
            while answers.answered.load(Ordering::Relaxed) < sent {
                anyhow::ensure!(Instant::now() < deadline, "a page was not answered in time");
                producer.poll(Duration::from_millis(1));
            }
            if transactional {
                let commit = Instant::now();
                producer.commit_transaction(TRANSACTION_TIMEOUT)?;
                commits.push(commit.elapsed());
            }
        }
        let elapsed = started.elapsed();
        let refused = answers.refused.load(Ordering::Relaxed);
        anyhow::ensure!(refused == 0, "{refused} records were refused");
        commits.sort();
        #[allow(clippy::cast_precision_loss)]
        Ok(Pages {
            rate: records as f64 / elapsed.as_secs_f64(),
            commit_p50: commits.get(commits.len() / 2).copied(),
        })
    })
    .await?
}
