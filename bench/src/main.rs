//! `flotilla-bench`: Flotilla's figures on this machine, in one run.
//!
//! `cargo run --release -p flotilla-bench -- [--smoke] [--only relay,...]`
//! with the services up (`scripts/services up`, then
//! `eval "$(scripts/services env)"`). Prints a table and writes it as JSON
//! under `bench/results/`. See `bench/README.md` for what each figure means.

mod broker;
mod ceiling;
mod clients;
mod comparison;
mod e2e;
mod engine;
mod fleet;
mod metrics;
mod relay;
mod report;
mod transactions;
mod wal;

use std::path::PathBuf;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "flotilla-bench",
    about = "Measure Flotilla end to end and by component"
)]
struct Args {
    /// Seconds, not minutes: small sizes, so CI keeps the benchmark working.
    #[arg(long)]
    smoke: bool,
    /// Run only these parts (comma separated): ceiling, broker, transactions, e2e, engine, parking, retention, fleet, graphile, river, relay, clients.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Jobs per end-to-end run (default: 20,000, or 200 with --smoke).
    #[arg(long)]
    jobs: Option<usize>,
    /// Brokers for the end-to-end runs (comma separated): mock (librdkafka's
    /// mock cluster), kafka (the Apache Kafka of `scripts/services`).
    #[arg(long, value_delimiter = ',', default_values_t = vec!["mock".to_owned(), "kafka".to_owned()])]
    brokers: Vec<String>,
    /// Internal: serve as a consumer-group member until killed (the broker
    /// part's SIGKILL measurement): bootstrap, topic, group, instance id.
    #[arg(long, num_args = 4, hide = true)]
    group_member: Option<Vec<String>>,
    /// Where the JSON results go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {cpu}")
}

/// The goals as ratios: end to end (the best worker count) against the
/// ceiling, and 1-step against graphile-worker and River (at its fastest),
/// per broker.
fn ratios(report: &mut report::Report) {
    let graphile = report.best("comparison", |name| {
        name.starts_with("graphile-worker") && name.ends_with("at once")
    });
    let river = report.best("comparison", |name| {
        name.starts_with("River 0") && name.ends_with("1 ms fetch cooldown")
    });
    // The whole job's WAL (engine and relay) against each competitor's.
    let wal = report.best("components", |name| {
        name == "WAL per 1-step no-op job, engine and relay"
    });
    let competitors_wal = [
        ("graphile-worker", "graphile-worker WAL per no-op job"),
        ("River", "River WAL per no-op job, 1 ms fetch cooldown"),
    ];
    for (other, figure) in competitors_wal {
        if let (Some(wal), Some(theirs)) = (wal, report.best("comparison", |name| name == figure)) {
            let name = format!("WAL per 1-step job, engine and relay / {other}");
            report.add("ratio", name, wal / theirs, "ratio");
        }
    }
    for broker in ["mock cluster", "Apache Kafka"] {
        for steps in [3, 1] {
            let prefix = format!("{steps}-step");
            let flotilla = report.best("end to end", |name| {
                name.starts_with(&prefix) && name.ends_with(broker)
            });
            let Some(flotilla) = flotilla else { continue };
            let ceiling = format!("pgbench, {steps}-step");
            if let Some(ceiling) = report.best("ceiling", |name| name.starts_with(&ceiling)) {
                let name = format!("{steps}-step end to end / ceiling, {broker}");
                report.add("ratio", name, flotilla / ceiling, "ratio");
            }
            if steps != 1 {
                continue;
            }
            let wal =
                format!("WAL per 1-step job, 1 worker(s), to the last COMPLETED read, {broker}");
            if let (Some(wal), Some(theirs)) = (
                report.best("end to end", |name| name == wal),
                report.best("comparison", |name| {
                    name == "graphile-worker WAL per no-op job"
                }),
            ) {
                let name = format!("WAL per 1-step job end to end / graphile-worker, {broker}");
                report.add("ratio", name, wal / theirs, "ratio");
            }
            for (other, rate) in [("graphile-worker", graphile), ("River", river)] {
                if let Some(rate) = rate {
                    let name = format!("1-step end to end / {other}, {broker}");
                    report.add("ratio", name, flotilla / rate, "ratio");
                }
            }
        }
    }
}

/// The broker a `--brokers` name stands for.
fn broker_kind(name: &str) -> anyhow::Result<e2e::BrokerKind> {
    match name {
        "mock" => Ok(e2e::BrokerKind::Mock),
        "kafka" => Ok(e2e::BrokerKind::Kafka),
        other => anyhow::bail!("--brokers: {other} is not mock or kafka"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(member) = &args.group_member {
        return broker::serve_member(member);
    }
    // What the in-process parts (the relay) say, filtered by RUST_LOG.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    metrics::install();
    let wanted = |part: &str| args.only.is_empty() || args.only.iter().any(|p| p == part);
    let mut report = report::Report {
        started_at: chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        machine: machine(),
        smoke: args.smoke,
        definition_by_reference: engine::definition_by_reference(),
        checkpoint_rows: engine::checkpoint_rows(),
        figures: Vec::new(),
    };
    if wanted("ceiling") {
        ceiling::run(&mut report, args.smoke).await?;
    }
    if wanted("broker") {
        broker::run(&mut report, args.smoke).await?;
    }
    if wanted("transactions") {
        transactions::run(&mut report, args.smoke).await?;
    }
    let jobs = args.jobs.unwrap_or(if args.smoke { 200 } else { 20_000 });
    if wanted("graphile") {
        comparison::graphile::figures(&mut report, jobs).await?;
    }
    if wanted("river") {
        comparison::river::figures(&mut report, jobs).await?;
    }
    if wanted("e2e") {
        for broker in &args.brokers {
            e2e::run(&mut report, broker_kind(broker)?, jobs).await?;
        }
    }
    if wanted("engine") {
        engine::figures(&mut report, args.smoke).await?;
    }
    if wanted("parking") {
        engine::parking(&mut report, args.smoke).await?;
    }
    if wanted("retention") {
        engine::retention(&mut report, args.smoke).await?;
        for broker in &args.brokers {
            e2e::retention_running(&mut report, broker_kind(broker)?, jobs).await?;
        }
    }
    if wanted("fleet") {
        fleet::run(&mut report, args.smoke).await?;
    }
    if wanted("relay") {
        relay::run(&mut report, args.smoke).await?;
    }
    if wanted("clients") {
        clients::run(&mut report, args.smoke).await?;
    }
    ratios(&mut report);
    println!("\n{}", report.table());
    let path = report.write(&args.out)?;
    println!("bench: results in {}", path.display());
    Ok(())
}
