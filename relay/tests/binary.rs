//! The relay binary starts, serves its health routes, and exits 0 on SIGTERM.
//!
//! Each test that runs the relay gives it a migrated database of its own:
//! the relay does not migrate, and the server's shared database has the
//! schema only once something else (the demo, a worker) migrated it.

use std::io::{Read as _, Write as _};
use std::process::Command;
use std::time::Duration;

use flotilla_tests::process::Running;
use sqlx::PgPool;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// A plain HTTP/1.1 GET: (status, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connecting to the relay");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// The relay on `database_url` and the shared broker, its health routes on a
/// free port.
fn relay(database_url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-relay"));
    command
        .env("DATABASE_URL", database_url)
        .env(
            "KAFKA_BOOTSTRAP_SERVERS",
            flotilla_tests::bootstrap_servers(),
        )
        .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0")
        .env("NO_COLOR", "1");
    command
}

/// Runs `body`, which drives a relay process and blocks, with the URL of
/// the test's own database.
async fn on_own_database(pool: &PgPool, body: fn(&str)) {
    let url = flotilla_tests::database::url_of(pool).await;
    tokio::task::spawn_blocking(move || body(&url))
        .await
        .unwrap();
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn relay_serves_health_readiness_and_metrics_and_exits_zero_on_sigterm(pool: PgPool) {
    on_own_database(&pool, serves_health_and_exits_zero).await;
}

fn serves_health_and_exits_zero(database_url: &str) {
    let mut running = Running::start(relay(database_url));
    running.wait_for_line("relay ready", Duration::from_secs(60));
    let line = running
        .output
        .iter()
        .find(|l| l.contains("relay health listening"))
        .expect("the health address is logged")
        .clone();
    let addr = line.rsplit("addr=").next().unwrap().trim().to_owned();
    assert_eq!(get(&addr, "/healthz").0, 200);
    let (ready, body) = get(&addr, "/readyz");
    assert_eq!(ready, 200, "{body}");
    let (status, metrics) = get(&addr, "/metrics");
    assert_eq!(status, 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut metrics = metrics;
    while !metrics.contains("flotilla_relay_rounds_total") {
        assert!(
            std::time::Instant::now() < deadline,
            "no round counted: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(100));
        metrics = get(&addr, "/metrics").1;
    }
    assert!(metrics.contains("flotilla_relay_buckets_held"), "{metrics}");
    for series in [
        r#"flotilla_relay_publish_failures_total{class="world",reason="timeout"} 0"#,
        r#"flotilla_relay_publish_failures_total{class="message",reason="too_large"} 0"#,
    ] {
        assert!(
            metrics.contains(series),
            "every class and reason starts at 0: {metrics}"
        );
    }
    assert!(
        metrics.contains("flotilla_relay_oldest_pending_seconds"),
        "{metrics}"
    );
    assert_eq!(get(&addr, "/nope").0, 404);
    let status = running.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit {status}:\n{}",
        running.output.join("\n")
    );
}

#[test]
fn settings_that_make_no_sense_are_refused_at_start_up_naming_the_flag() {
    for (variable, value, flag) in [
        ("FLOTILLA_RELAY_BATCH_SIZE", "0", "--batch-size"),
        ("FLOTILLA_RELAY_LEASE", "0s", "--lease"),
        (
            "FLOTILLA_RELAY_IDLE_POLL_MAX",
            "999years",
            "--idle-poll-max",
        ),
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-relay"));
        command
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
            .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0")
            .env(variable, value);
        flotilla_tests::process::assert_refused(command, flag, value);
    }
}

/// The relay's producer settings cannot be reached by a pass-through
/// property either, under any of their names.
#[test]
fn pinned_kafka_settings_are_refused_at_start_up_by_name() {
    for property in [
        "acks=0",
        "message.timeout.ms=999999",
        "enable.idempotence=true",
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-relay"));
        command
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
            .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0")
            .args(["--kafka-property", property]);
        let key = property.split_once('=').unwrap().0;
        flotilla_tests::process::assert_refused(command, key, "cannot be overridden");
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn with_topic_creation_off_the_relay_leaves_topics_to_the_operator(pool: PgPool) {
    on_own_database(&pool, leaves_topics_to_the_operator).await;
}

fn leaves_topics_to_the_operator(database_url: &str) {
    let mut command = relay(database_url);
    command
        .env(
            "FLOTILLA_EVENT_TOPIC",
            flotilla_tests::unique("operator-made"),
        )
        .env("FLOTILLA_CREATE_TOPICS", "false");
    let mut running = Running::start(command);
    running.wait_for_line("relay ready", Duration::from_secs(60));
    assert!(
        running
            .output
            .iter()
            .any(|l| l.contains("do not exist and creation is off") && l.contains("operator-made")),
        "{}",
        running.output.join("\n")
    );
    assert!(running.terminate(Duration::from_secs(30)).success());
}
