//! Kafka over SASL_SSL end to end: a request produced by the CLI, consumed
//! by a worker, run, and its events published by a relay and read back, every
//! client speaking TLS and SCRAM-SHA-512 with the settings a managed cluster
//! needs (`KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_*`, `KAFKA_SSL_CA_LOCATION`).
//!
//! The broker is an Apache Kafka node of the test's own with a listener of
//! that kind beside its plaintext one: SASL_SSL with a SCRAM-SHA-512 user
//! created when its storage is formatted, or SSL requiring a client
//! certificate (`ssl.client.auth=required`), each presenting a certificate
//! from a CA of the test's own (PEM files, no Java keystore).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use axum::routing::post;
use flotilla_runtime::BrokerConfig;
use flotilla_runtime::kafka::security::{SaslMechanism, SecurityProtocol};
use flotilla_tests::free_port;
use flotilla_tests::kafka::{KafkaOptions, OwnKafka};
use flotilla_tests::process::Running;
use flotilla_tests::tls::TestCertificates;
use flotilla_tests::{close_consumer, unique};
use rdkafka::Message as _;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use secrecy::SecretString;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;
const USER: &str = "flotilla";
const PASSWORD: &str = "s3cret-scram";
const DATABASE_PASSWORD: &str = "s3cret-database";
const API_TOKEN: &str = "s3cret-api-token";

/// The secured broker: Kafka over TLS with one user, who may sign in with
/// PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
struct SecuredBroker {
    bootstrap: String,
    certs: TestCertificates,
    password_file: PathBuf,
    _broker: OwnKafka,
}

/// A Kafka node whose listener `kind` (`SASL_SSL`, `SSL`) on `localhost`
/// (the name in the certificate) presents the test's server certificate,
/// with `settings` beside; returns the node and that listener's address.
async fn tls_broker(
    dir: &Path,
    certs: &TestCertificates,
    kind: &str,
    settings: &[String],
    format_args: &[String],
) -> (OwnKafka, String) {
    // Kafka reads a PEM key store as one file: the key, then the chain.
    let keystore = certs.dir.join("server-keystore.pem");
    let key = std::fs::read_to_string(&certs.server_key).unwrap();
    let chain = std::fs::read_to_string(&certs.server_certificate).unwrap();
    std::fs::write(&keystore, format!("{key}{chain}")).unwrap();
    let address = format!("localhost:{}", free_port());
    let mut options = KafkaOptions {
        extra_listeners: vec![format!("{kind}://{address}")],
        format_args: format_args.to_vec(),
        ..KafkaOptions::default()
    }
    .set("ssl.keystore.type=PEM")
    .set(&format!("ssl.keystore.location={}", keystore.display()));
    options.settings.extend_from_slice(settings);
    let dir = dir.to_owned();
    let broker = tokio::task::spawn_blocking(move || OwnKafka::start_with(&dir, options))
        .await
        .unwrap();
    (broker, address)
}

async fn secured_broker(dir: &Path) -> SecuredBroker {
    let certs = TestCertificates::generate(&dir.join("certs"), "client");
    let (broker, bootstrap) = tls_broker(
        dir,
        &certs,
        "SASL_SSL",
        &[
            "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512".into(),
            format!("listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_{USER}=\"{PASSWORD}\";"),
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;".into(),
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;".into(),
        ],
        &[
            "--add-scram".into(),
            format!("SCRAM-SHA-512=[name={USER},password={PASSWORD}]"),
            "--add-scram".into(),
            format!("SCRAM-SHA-256=[name={USER},password={PASSWORD}]"),
        ],
    )
    .await;
    let password_file = certs.dir.join("kafka-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    SecuredBroker {
        bootstrap,
        certs,
        password_file,
        _broker: broker,
    }
}

impl SecuredBroker {
    /// The settings every binary gets, as environment variables.
    fn env(&self, command: &mut Command) {
        command
            .env("KAFKA_BOOTSTRAP_SERVERS", &self.bootstrap)
            .env("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
            .env("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
            .env("KAFKA_SASL_USERNAME", USER)
            .env("KAFKA_SASL_PASSWORD_FILE", &self.password_file)
            .env("KAFKA_SSL_CA_LOCATION", &self.certs.ca)
            .env("SCHEMA_REGISTRY_URL", "")
            .env("FLOTILLA_TOPIC_PARTITIONS", "1")
            .env("FLOTILLA_TOPIC_REPLICATION", "1")
            .env("NO_COLOR", "1");
    }

    /// The same settings for a client made in this test.
    fn config(&self) -> BrokerConfig {
        let mut config = BrokerConfig::new(&self.bootstrap);
        let security = &mut config.security;
        security.kafka_security_protocol = Some(SecurityProtocol::SaslSsl);
        security.kafka_sasl_mechanism = Some(SaslMechanism::ScramSha512);
        security.kafka_sasl_username = Some(USER.into());
        security.kafka_sasl_password = Some(SecretString::from(PASSWORD));
        security.kafka_ssl_ca_location = Some(self.certs.ca.clone());
        config
    }
}

fn worker(broker: &SecuredBroker, database: &str, dir: &Path, topic: &str) -> Command {
    let mut command = worker_without_broker(database, dir, topic);
    broker.env(&mut command);
    command
}

/// The worker's settings but the broker's.
fn worker_without_broker(database: &str, dir: &Path, topic: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
    command
        .env("DATABASE_URL", database)
        .env("FLOTILLA_WORKER_ID", "secure-worker")
        .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
        .env("FLOTILLA_API_TOKENS", API_TOKEN)
        .env("FLOTILLA_REQUEST_TOPIC", topic)
        .env("FLOTILLA_CONSUMER_GROUP", unique("secure-workers"))
        .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
        .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"))
        .env("FLOTILLA_KAFKA_CONNECT_TIMEOUT", "15s");
    command
}

async fn echo_target() -> String {
    let app = axum::Router::new().route("/{m}", post(|| async { axum::Json(json!({})) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn write_fleet_files(dir: &Path, target: &str) {
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        format!("targets:\n  echo:\n    kind: http\n    base_url: {target}\n"),
    )
    .unwrap();
    let workflow = json!({"name": "secure", "input_schema": {},
        "steps": [{"name": "one", "target": "echo", "method": "one"}]});
    std::fs::write(dir.join("workflows/secure.json"), workflow.to_string()).unwrap();
}

fn run_to_end(mut command: Command) -> Output {
    command.output().unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_request_travels_over_sasl_ssl_with_scram_from_producer_to_event(pool: PgPool) {
    tokio::time::timeout(Duration::from_secs(150), sasl_ssl_end_to_end(pool))
        .await
        .expect("the SASL_SSL run timed out");
}

async fn sasl_ssl_end_to_end(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("flotilla-sasl-{}", Uuid::new_v4()));
    let broker = secured_broker(&dir).await;
    write_fleet_files(&dir, &echo_target().await);
    // The local server trusts every password, so the URL can carry one that
    // must never be seen again.
    let database = flotilla_tests::database::url_of(&pool).await.replacen(
        "://postgres@",
        &format!("://postgres:{DATABASE_PASSWORD}@"),
        1,
    );
    assert!(database.contains(DATABASE_PASSWORD), "{database}");
    let (requests, events) = (unique("secure-requests"), unique("secure-events"));

    let mut worker = {
        let command = worker(&broker, &database, &dir, &requests);
        flotilla_tests::process::started(command, "worker ready").await
    };
    let mut relay = {
        let mut command = Command::new(flotilla_tests::process::workspace_binary("flotilla-relay"));
        broker.env(&mut command);
        command
            .env("DATABASE_URL", &database)
            .env("FLOTILLA_EVENT_TOPIC", &events)
            .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0");
        tokio::task::spawn_blocking(move || {
            let mut running = Running::start(command);
            running.wait_for_line("relay ready", Duration::from_secs(60));
            running
        })
        .await
        .unwrap()
    };

    // The CLI produces, with the same settings.
    let job = Uuid::new_v4();
    let mut produce = Command::new(flotilla_tests::process::workspace_binary("flotilla"));
    broker.env(&mut produce);
    produce
        .env("FLOTILLA_REQUEST_TOPIC", &requests)
        .args(["produce", "--workflow", "secure", "--job-id"])
        .arg(job.to_string());
    let produced = tokio::task::spawn_blocking(move || run_to_end(produce))
        .await
        .unwrap();
    assert!(
        produced.status.success(),
        "flotilla produce: {}",
        String::from_utf8_lossy(&produced.stderr)
    );

    // The job completes and every event of it is published.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, pending): (Option<String>, i64) = sqlx::query_as(
            "SELECT (SELECT status FROM workflow_run WHERE job_id = $1), \
             (SELECT count(*) FROM workflow_run_outbox_state WHERE status <> 'PUBLISHED')",
        )
        .bind(job)
        .fetch_one(&pool)
        .await
        .unwrap();
        if status.as_deref() == Some("COMPLETED") && pending == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "job {job}: {status:?}, {pending} events unpublished"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let expected: i64 =
        sqlx::query_scalar("SELECT event_sequence FROM workflow_run WHERE job_id = $1")
            .bind(job)
            .fetch_one(&pool)
            .await
            .unwrap();

    // Read back over SASL_SSL.
    let consumer: StreamConsumer = broker
        .config()
        .manual_commit_consumer(&unique("secure-reader"))
        .create()
        .unwrap();
    consumer.subscribe(&[&events]).unwrap();
    let mut sequences = Vec::new();
    let mut payloads = Vec::new();
    while sequences.len() < usize::try_from(expected).unwrap() {
        let message = consumer.recv().await.unwrap();
        payloads.push(String::from_utf8_lossy(message.payload().unwrap()).into_owned());
        let event = flotilla_contracts::json::decode::<flotilla_contracts::WorkflowRunEvent>(
            message.payload().unwrap(),
        )
        .unwrap();
        assert_eq!(event.job_id(), job);
        sequences.push(event.sequence());
    }
    close_consumer(consumer);
    assert_eq!(sequences, (1..=expected).collect::<Vec<_>>());

    let (worker, relay) = tokio::task::spawn_blocking(move || {
        worker.terminate(Duration::from_secs(20));
        relay.terminate(Duration::from_secs(20));
        (worker, relay)
    })
    .await
    .unwrap();

    // No secret given as a setting shows up in a log line or an event.
    let cli_output = [
        String::from_utf8_lossy(&produced.stdout).into_owned(),
        String::from_utf8_lossy(&produced.stderr).into_owned(),
    ];
    let seen = worker
        .output
        .iter()
        .chain(&relay.output)
        .chain(&payloads)
        .chain(&cli_output);
    for line in seen {
        for secret in [PASSWORD, DATABASE_PASSWORD, API_TOKEN] {
            assert!(!line.contains(secret), "a secret leaked: {line}");
        }
    }
    assert!(!worker.output.is_empty() && !relay.output.is_empty());
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

/// PLAIN and SCRAM-SHA-256 as the broker checks them: a worker signing in
/// with each reaches the broker, creates its topics and subscribes.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_worker_signs_in_with_plain_and_with_scram_sha_256(pool: PgPool) {
    tokio::time::timeout(Duration::from_secs(120), other_mechanisms(pool))
        .await
        .expect("the other mechanisms timed out");
}

async fn other_mechanisms(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("flotilla-sasl-mechanisms-{}", Uuid::new_v4()));
    let broker = secured_broker(&dir).await;
    write_fleet_files(&dir, "http://127.0.0.1:9");
    let database = flotilla_tests::database::url_of(&pool).await;
    for mechanism in ["PLAIN", "SCRAM-SHA-256"] {
        let mut command = worker(&broker, &database, &dir, &unique("mechanism"));
        command.env("KAFKA_SASL_MECHANISM", mechanism);
        let mut running = flotilla_tests::process::started(command, "worker ready").await;
        let status = tokio::task::spawn_blocking(move || {
            let status = running.terminate(Duration::from_secs(20));
            (status, running)
        })
        .await
        .unwrap();
        assert!(
            status.0.success(),
            "{mechanism}: {}",
            status.1.output.join("\n")
        );
    }
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_untrusted_broker_certificate_a_missing_or_a_wrong_password_stops_start_up(
    pool: PgPool,
) {
    tokio::time::timeout(Duration::from_secs(120), refusals(pool))
        .await
        .expect("the refusals timed out");
}

async fn refusals(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("flotilla-sasl-refused-{}", Uuid::new_v4()));
    let broker = secured_broker(&dir).await;
    write_fleet_files(&dir, "http://127.0.0.1:9");
    let database = flotilla_tests::database::url_of(&pool).await;

    let mut untrusted = worker(&broker, &database, &dir, &unique("refused"));
    untrusted.env("KAFKA_SSL_CA_LOCATION", &broker.certs.other_ca);
    let mut no_password = worker(&broker, &database, &dir, &unique("refused"));
    no_password.env_remove("KAFKA_SASL_PASSWORD_FILE");
    let wrong_file = dir.join("wrong-password");
    std::fs::write(&wrong_file, "not-the-password").unwrap();
    let mut wrong = worker(&broker, &database, &dir, &unique("refused"));
    wrong.env("KAFKA_SASL_PASSWORD_FILE", &wrong_file);
    let (untrusted, no_password, wrong) = tokio::task::spawn_blocking(move || {
        (
            run_to_end(untrusted),
            run_to_end(no_password),
            run_to_end(wrong),
        )
    })
    .await
    .unwrap();

    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    assert!(!untrusted.status.success());
    assert!(stderr.contains("reaching the Kafka broker"), "{stderr}");
    assert!(stderr.contains("certificate verify failed"), "{stderr}");
    let stderr = String::from_utf8_lossy(&no_password.stderr);
    assert!(!no_password.status.success());
    assert!(stderr.contains("KAFKA_SASL_PASSWORD"), "{stderr}");
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success(), "a wrong password was let in");
    assert!(stderr.contains("SASL authentication"), "{stderr}");
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A Kafka node whose TLS listener lets through only clients presenting a
/// certificate from the test CA (no SASL).
struct CertificateBroker {
    bootstrap: String,
    certs: TestCertificates,
    _broker: OwnKafka,
}

async fn certificate_broker(dir: &Path) -> CertificateBroker {
    let certs = TestCertificates::generate(&dir.join("certs"), "flotilla");
    let (broker, bootstrap) = tls_broker(
        dir,
        &certs,
        "SSL",
        &[
            "ssl.client.auth=required".into(),
            "ssl.truststore.type=PEM".into(),
            format!("ssl.truststore.location={}", certs.ca.display()),
        ],
        &[],
    )
    .await;
    CertificateBroker {
        bootstrap,
        certs,
        _broker: broker,
    }
}

impl CertificateBroker {
    /// TLS with the test CA, and the client certificate when `with_certificate`.
    fn env(&self, command: &mut Command, with_certificate: bool) {
        command
            .env("KAFKA_BOOTSTRAP_SERVERS", &self.bootstrap)
            .env("KAFKA_SECURITY_PROTOCOL", "SSL")
            .env("KAFKA_SSL_CA_LOCATION", &self.certs.ca)
            .env("SCHEMA_REGISTRY_URL", "")
            .env("FLOTILLA_TOPIC_PARTITIONS", "1")
            .env("FLOTILLA_TOPIC_REPLICATION", "1")
            .env("NO_COLOR", "1");
        if with_certificate {
            command
                .env(
                    "KAFKA_SSL_CERTIFICATE_LOCATION",
                    &self.certs.client_certificate,
                )
                .env("KAFKA_SSL_KEY_LOCATION", &self.certs.client_key);
        } else {
            command
                .env_remove("KAFKA_SSL_CERTIFICATE_LOCATION")
                .env_remove("KAFKA_SSL_KEY_LOCATION");
        }
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_broker_requiring_a_client_certificate_takes_the_configured_one_and_refuses_none(
    pool: PgPool,
) {
    tokio::time::timeout(Duration::from_secs(120), client_certificates(pool))
        .await
        .expect("the client certificate run timed out");
}

async fn client_certificates(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("flotilla-kafka-mtls-{}", Uuid::new_v4()));
    let broker = certificate_broker(&dir).await;
    write_fleet_files(&dir, "http://127.0.0.1:9");
    let database = flotilla_tests::database::url_of(&pool).await;
    let requests = unique("mtls-requests");

    // With the certificate: the worker starts (its consumer and the topic
    // are reached through the proxy), and the CLI's produce is acknowledged.
    let mut certified = worker_without_broker(&database, &dir, &requests);
    broker.env(&mut certified, true);
    let mut produce = Command::new(flotilla_tests::process::workspace_binary("flotilla"));
    broker.env(&mut produce, true);
    produce
        .env("FLOTILLA_REQUEST_TOPIC", &requests)
        .args(["produce", "--workflow", "secure"]);
    let mut anonymous = worker_without_broker(&database, &dir, &unique("mtls-refused"));
    broker.env(&mut anonymous, false);
    let (produced, refused) = tokio::task::spawn_blocking(move || {
        let mut running = Running::start(certified);
        running.wait_for_line("worker ready", Duration::from_secs(60));
        let produced = run_to_end(produce);
        let status = running.terminate(Duration::from_secs(20));
        assert!(status.success(), "{status:?}: {:#?}", running.output);
        (produced, run_to_end(anonymous))
    })
    .await
    .unwrap();
    assert!(
        produced.status.success(),
        "flotilla produce: {}",
        String::from_utf8_lossy(&produced.stderr)
    );

    // Without it the handshake is refused (Kafka's JSSE answers a missing
    // certificate with the bad_certificate alert), and start-up says so.
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "no certificate was let in");
    assert!(stderr.contains("reaching the Kafka broker"), "{stderr}");
    assert!(stderr.contains("alert bad certificate"), "{stderr}");
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}
