//! The client libraries' bulk submission through Kafka, as a user runs it:
//! 10,000 requests (1,000 with `--smoke`) to a topic of their own on Apache
//! Kafka, Avro through the registry when `SCHEMA_REGISTRY_URL` is set,
//! every one acknowledged by the broker. Rust's `Submitter::submit_all` in
//! this process; Python's `KafkaSubmitter.submit_many` in the examples'
//! interpreter (`FLOTILLA_EXAMPLES_PYTHON`, skipped without it), the
//! package from `clients/python`.

use std::process::Command;
use std::time::Instant;

use flotilla_client::{BrokerConfig, RegistryConfig, Submission, Submitter};

use crate::report::Report;

/// What the Python side runs: prints the seconds and how many were acknowledged.
const PYTHON: &str = r#"
import os, sys, time
from flotilla_client import KafkaSubmitter, Receipt
count, topic = int(sys.argv[1]), sys.argv[2]
submitter = KafkaSubmitter(os.environ["KAFKA_BOOTSTRAP_SERVERS"],
                           registry_url=os.environ.get("SCHEMA_REGISTRY_URL") or None, topic=topic)
submitter.submit("bench-warm-up", {})
requests = [("bench-bulk", {"n": n}) for n in range(count)]
started = time.monotonic()
outcomes = submitter.submit_many(requests, timeout=120)
took = time.monotonic() - started
print(took, sum(isinstance(o, Receipt) for o in outcomes))
"#;

pub(crate) async fn run(report: &mut Report, smoke: bool) -> anyhow::Result<()> {
    let count: usize = if smoke { 1_000 } else { 10_000 };
    let topic = flotilla_tests::unique("bench-bulk");
    flotilla_tests::create_topic(&topic, 6).await?;
    let registry = std::env::var("SCHEMA_REGISTRY_URL").unwrap_or_default();
    let encoding = if registry.is_empty() { "JSON" } else { "Avro" };
    let mut broker = BrokerConfig::new(&flotilla_tests::bootstrap_servers());
    broker.registry = RegistryConfig::new(&registry);
    let submitter = Submitter::kafka(&broker)?.with_request_topic(&topic);
    // The schema registered and the connections made before the clock starts.
    submitter
        .submit(&Submission::new("bench-warm-up", &serde_json::json!({}))?)
        .await?;
    let submissions = (0..count)
        .map(|n| Submission::new("bench-bulk", &serde_json::json!({ "n": n })))
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let outcomes = submitter.submit_all(&submissions).await;
    let took = started.elapsed().as_secs_f64();
    let acknowledged = outcomes.iter().filter(|o| o.is_ok()).count();
    anyhow::ensure!(
        acknowledged == count,
        "Rust: {acknowledged} of {count} acknowledged"
    );
    report.add(
        "clients",
        format!("{count} submissions through Kafka ({encoding}), Rust submit_all"),
        took,
        "s",
    );
    println!("bench: clients Rust submit_all: {count} in {took:.2} s");

    let Ok(python) = std::env::var("FLOTILLA_EXAMPLES_PYTHON") else {
        println!("bench: clients Python skipped: FLOTILLA_EXAMPLES_PYTHON is not set");
        return Ok(());
    };
    let package = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let output = Command::new(python)
        .args(["-c", PYTHON, &count.to_string(), &topic])
        .env("PYTHONPATH", package)
        .env("SCHEMA_REGISTRY_URL", &registry)
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "Python: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    let mut figures = printed.split_whitespace();
    let took: f64 = figures.next().unwrap_or_default().parse()?;
    let acknowledged: usize = figures.next().unwrap_or_default().parse()?;
    anyhow::ensure!(
        acknowledged == count,
        "Python: {acknowledged} of {count} acknowledged"
    );
    report.add(
        "clients",
        format!("{count} submissions through Kafka ({encoding}), Python submit_many"),
        took,
        "s",
    );
    println!("bench: clients Python submit_many: {count} in {took:.2} s");
    Ok(())
}
