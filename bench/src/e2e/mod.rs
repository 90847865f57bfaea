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

mod processes;
use processes::*;

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

/// What one end-to-end run measured.
struct Throughput {
    jobs_per_second: f64,
    /// The server's WAL from the first produce to the last COMPLETED event
    /// read, per job: ingestion, the engine and the relay (the marks of the
    /// last events read are not in it; on a server of its own meanwhile).
    wal_bytes_per_job: f64,
}

/// The server's current WAL position, as bytes from its start.
async fn wal_position(pool: &sqlx::PgPool) -> anyhow::Result<f64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8")
            .fetch_one(pool)
            .await?,
    )
}

/// Jobs per second from the first produce to the last COMPLETED event read.
async fn throughput(
    kind: BrokerKind,
    workflow: &str,
    workers: usize,
    jobs: usize,
) -> anyhow::Result<(Throughput, Fleet)> {
    let fleet = Fleet::start(kind, workers, Role::Run).await?;
    let ids: Vec<Uuid> = (0..jobs).map(|_| Uuid::new_v4()).collect();
    let reader = fleet
        .read_completed(ids.iter().copied().collect(), Duration::from_secs(1200))
        .await?;
    let wal_before = wal_position(&fleet.database.pool).await?;
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
    let wal = wal_position(&fleet.database.pool).await? - wal_before;
    #[allow(clippy::cast_precision_loss)]
    let measured = Throughput {
        jobs_per_second: jobs as f64 / last.duration_since(started).as_secs_f64(),
        wal_bytes_per_job: wal / jobs as f64,
    };
    Ok((measured, fleet))
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
            let (measured, fleet) = throughput(kind, workflow, workers, jobs).await?;
            let rate = measured.jobs_per_second;
            report.add(
                "end to end",
                format!("{steps}-step, {jobs} jobs, {workers} worker(s), 1 relay, {broker}"),
                rate,
                "jobs/s",
            );
            report.add(
                "end to end",
                format!("WAL per {steps}-step job, {workers} worker(s), to the last COMPLETED read, {broker}"),
                measured.wal_bytes_per_job,
                "bytes",
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
    let (measured, fleet) = throughput(kind, KAFKA_WORKFLOW, 1, jobs).await?;
    report.add(
        "end to end",
        format!("Kafka-target step, 1-step, {jobs} jobs, 1 worker, 1 relay, {broker}"),
        measured.jobs_per_second,
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
