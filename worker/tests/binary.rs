//! The worker binary: `migrate` applies the migrations, the worker starts,
//! connects, and exits 0 on SIGTERM, and a blank worker id is refused.

use std::process::Command;
use std::time::Duration;

use flotilla_tests::process::Running;
use sqlx::PgPool;

const BINARY: &str = env!("CARGO_BIN_EXE_flotilla-worker");

fn worker(database_url: &str) -> Command {
    let mut command = flotilla_tests::process::with_services(BINARY, database_url);
    command
        .env("FLOTILLA_WORKER_ID", "binary-test")
        .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
        .env("FLOTILLA_API_TOKENS", "test-token")
        .env(
            "FLOTILLA_REQUEST_TOPIC",
            flotilla_tests::unique("binary-requests"),
        )
        .env(
            "FLOTILLA_CONSUMER_GROUP",
            flotilla_tests::unique("binary-workers"),
        );
    command
}

/// The API address a running worker logged when it was ready.
fn api_of(running: &Running) -> String {
    format!(
        "http://{}",
        running
            .logged("worker ready", "api")
            .expect("the API's address")
    )
}

/// Starts `command` and waits (off the runtime) until it is ready.
async fn ready(command: Command) -> Running {
    flotilla_tests::process::started(command, "worker ready").await
}

/// SIGKILLs `running`, off the runtime.
async fn kill(running: Running) {
    tokio::task::spawn_blocking(move || {
        let mut running = running;
        running.kill();
    })
    .await
    .unwrap();
}

/// Submits a job of `workflow` through the API of `running`; its id.
async fn submit_through(running: &Running, workflow: &str) -> uuid::Uuid {
    let submitted = flotilla_runtime::tls::http_client()
        .build()
        .unwrap()
        .post(format!("{}/v1/jobs", api_of(running)))
        .bearer_auth("test-token")
        .json(&serde_json::json!({"workflow_name": workflow, "input": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(submitted.status(), reqwest::StatusCode::CREATED);
    let job: serde_json::Value = submitted.json().await.unwrap();
    job["job_id"].as_str().unwrap().parse().unwrap()
}

#[sqlx::test(migrations = false)]
async fn migrate_subcommand_applies_the_migrations(pool: PgPool) {
    let url = flotilla_tests::database::url_of(&pool).await;
    let mut migrate = Command::new(BINARY);
    migrate.arg("migrate").env("DATABASE_URL", &url);
    let mut running = Running::start(migrate);
    let status = running.wait(Duration::from_secs(60));
    assert!(
        status.success(),
        "migrate failed:\n{}",
        running.output.join("\n")
    );
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'workflow_run'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 1);
}

/// Migrations hold a session lock a transaction-mode pooler cannot carry:
/// told it is behind one, `migrate` refuses, naming the setting, and
/// changes nothing.
#[sqlx::test]
async fn migrate_through_a_transaction_mode_pooler_is_refused(pool: PgPool) {
    let url = flotilla_tests::database::url_of(&pool).await;
    let mut migrate = Command::new(BINARY);
    migrate
        .arg("migrate")
        .env("DATABASE_URL", &url)
        .env("FLOTILLA_DB_POOLER", "transaction");
    flotilla_tests::process::assert_refused(migrate, "FLOTILLA_DB_POOLER", "pooler");
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'workflow_run'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 0, "nothing migrated");
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn worker_exits_zero_on_sigterm(pool: PgPool) {
    let mut running = Running::start(worker(&flotilla_tests::database::url_of(&pool).await));
    running.wait_for_line("worker ready", Duration::from_secs(60));
    let status = running.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit {status}:\n{}",
        running.output.join("\n")
    );
    assert!(
        running
            .output
            .iter()
            .any(|l| l.contains("shutdown signal received"))
    );
}

#[test]
fn blank_worker_id_is_refused() {
    let mut command = worker("postgres://127.0.0.1:1/none");
    command.env("FLOTILLA_WORKER_ID", "   ");
    let mut running = Running::start(command);
    let status = running.wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        running
            .output
            .iter()
            .any(|l| l.contains("the worker id is blank")),
        "{}",
        running.output.join("\n")
    );
}

#[test]
fn unreachable_database_fails_start_up_with_the_reason() {
    let mut command = worker("postgres://postgres@127.0.0.1:1/none");
    command.env("FLOTILLA_DB_ACQUIRE_TIMEOUT", "2s");
    let mut running = Running::start(command);
    let status = running.wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        running
            .output
            .iter()
            .any(|l| l.contains("connecting to Postgres")),
        "{}",
        running.output.join("\n")
    );
}

/// A target service on port 0 whose `/slow` answers after `delay` and
/// tells the test when a call arrives.
async fn slow_service(delay: Duration) -> (String, tokio::sync::mpsc::UnboundedReceiver<()>) {
    use axum::routing::post;
    let (arrived, calls) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/slow",
        post(move || {
            let arrived = arrived.clone();
            async move {
                let _ = arrived.send(());
                tokio::time::sleep(delay).await;
                axum::Json(serde_json::json!({"ok": true}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, calls)
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn worker_runs_a_request_from_kafka_and_finishes_it_after_sigterm(pool: PgPool) {
    let (url, mut calls) = slow_service(Duration::from_millis(500)).await;
    let dir = std::env::temp_dir().join(format!("flotilla-binary-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        format!("targets:\n  svc:\n    kind: http\n    base_url: {url}\n"),
    )
    .unwrap();
    let workflow = serde_json::json!({
        "name": "slow", "input_schema": {},
        "steps": [{"name": "call", "target": "svc", "method": "slow"}]
    });
    std::fs::write(dir.join("workflows/slow.json"), workflow.to_string()).unwrap();

    let topic = flotilla_tests::unique("binary-requests");
    let mut command = worker(&flotilla_tests::database::url_of(&pool).await);
    command
        .env("FLOTILLA_REQUEST_TOPIC", &topic)
        .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
        .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"))
        .env("FLOTILLA_SHUTDOWN_GRACE", "30s");
    let mut running = tokio::task::spawn_blocking(move || {
        let mut running = Running::start(command);
        running.wait_for_line("worker ready", Duration::from_secs(60));
        running
    })
    .await
    .unwrap();

    // The request arrives over Kafka, as a client would send it.
    let job_id = uuid::Uuid::new_v4();
    let request =
        flotilla_contracts::WorkflowRunRequest::new(job_id, "slow", serde_json::json!({})).unwrap();
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", flotilla_tests::bootstrap_servers())
        .create()
        .unwrap();
    let payload = flotilla_contracts::json::encode(&request).unwrap();
    let key = job_id.to_string();
    producer
        .send(
            rdkafka::producer::FutureRecord::to(&topic)
                .key(&key)
                .payload(&payload),
            Duration::from_secs(10),
        )
        .await
        .unwrap();

    tokio::time::timeout(Duration::from_secs(30), calls.recv())
        .await
        .expect("the worker never called the target");
    let (status, output) = tokio::task::spawn_blocking(move || {
        let status = running.terminate(Duration::from_secs(30));
        (status, running.output.join("\n"))
    })
    .await
    .unwrap();
    assert!(status.success(), "exit {status}:\n{output}");
    let (state,): (String,) = sqlx::query_as("SELECT status FROM workflow_run WHERE job_id = $1")
        .bind(job_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        state, "COMPLETED",
        "the in-flight segment finished before exit:\n{output}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn worker_refuses_to_serve_the_api_without_tokens_unless_told_to() {
    let mut command = worker("postgres://postgres@127.0.0.1:1/none");
    command.env("FLOTILLA_API_TOKENS", "");
    let mut running = Running::start(command);
    let status = running.wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        running.output.iter().any(|l| l.contains("no API tokens")),
        "{}",
        running.output.join("\n")
    );
}

#[test]
fn settings_that_would_panic_or_make_no_sense_are_refused_at_start_up_naming_the_flag() {
    let cases = [
        ("FLOTILLA_SWEEP_INTERVAL", "0s", "--sweep-interval"),
        ("FLOTILLA_LEASE", "1000years", "--lease"),
        ("FLOTILLA_LEASE", "0s", "--lease"),
        ("FLOTILLA_IDLE_POLL_MAX", "0ms", "--idle-poll-max"),
        ("FLOTILLA_REQUEST_BATCH_SIZE", "0", "--request-batch-size"),
        ("FLOTILLA_WORKER_COUNT", "100000", "--worker-count"),
        ("FLOTILLA_DB_ACQUIRE_TIMEOUT", "0s", "--db-acquire-timeout"),
        // Only `auto`, `true` or `false`: a value read as "off" by accident
        // would keep copies silently, one read as "on" would strand older
        // workers.
        (
            "FLOTILLA_DEFINITION_BY_REFERENCE",
            "yes",
            "--definition-by-reference",
        ),
        ("FLOTILLA_CHECKPOINT_ROWS", "1", "--checkpoint-rows"),
        ("FLOTILLA_RETAIN_COMPLETED", "0s", "--retain-completed"),
        (
            "FLOTILLA_REMOVED_ID_HORIZON",
            "1000years",
            "--removed-id-horizon",
        ),
        (
            "FLOTILLA_RETAIN_BY_WORKFLOW",
            "payments:RUNNING=1d",
            "--retain-by-workflow",
        ),
        ("FLOTILLA_RETENTION_BATCH", "0", "--retention-batch"),
        // Only `none` or `transaction`: a pooler mode it does not know
        // would leave statements that a pooler breaks.
        ("FLOTILLA_DB_POOLER", "statement", "--db-pooler"),
    ];
    for (variable, value, flag) in cases {
        let mut command = worker("postgres://postgres@127.0.0.1:1/none");
        command.env(variable, value);
        flotilla_tests::process::assert_refused(command, flag, value);
    }
}

/// A reply group that is the request group would put two members with one
/// `group.instance.id` in one group: refused before anything is reached.
#[test]
fn a_reply_consumer_group_that_is_the_request_group_is_refused_at_start_up() {
    let mut command = worker("postgres://postgres@127.0.0.1:1/none");
    command
        .env("FLOTILLA_CONSUMER_GROUP", "fleet")
        .env("FLOTILLA_REPLY_CONSUMER_GROUP", "fleet");
    flotilla_tests::process::assert_refused(command, "FLOTILLA_REPLY_CONSUMER_GROUP", "fleet");
}

/// Under the consumer group protocol the broker owns the session, the
/// heartbeat and the assignment: a pass-through property setting one is
/// refused at start-up by name, as is `group.protocol` itself (it is
/// `FLOTILLA_GROUP_PROTOCOL`), before anything is reached.
#[test]
fn broker_owned_settings_under_the_consumer_protocol_are_refused_at_start_up_by_name() {
    for property in [
        "session.timeout.ms=10000",
        "heartbeat.interval.ms=1000",
        "partition.assignment.strategy=range",
        "group.protocol.type=consumer",
    ] {
        let mut command = worker("postgres://postgres@127.0.0.1:1/none");
        command
            .env("FLOTILLA_GROUP_PROTOCOL", "consumer")
            .args(["--kafka-property", property]);
        let key = property.split('=').next().unwrap();
        flotilla_tests::process::assert_refused(command, key, "the broker owns it");
    }
    let mut command = worker("postgres://postgres@127.0.0.1:1/none");
    command.args(["--kafka-property", "group.protocol=consumer"]);
    flotilla_tests::process::assert_refused(command, "group.protocol", "FLOTILLA_GROUP_PROTOCOL");
}

/// Static membership under the consumer group protocol would bring a
/// crashed worker back with a dead consumer (Kafka refuses the restarted
/// static member until the old one's session expires, fatally for
/// librdkafka): refused at start-up naming both settings; unset, the
/// protocol's default (dynamic) applies.
#[test]
fn static_membership_under_the_consumer_protocol_is_refused_at_start_up() {
    let mut command = worker("postgres://postgres@127.0.0.1:1/none");
    command
        .env("FLOTILLA_GROUP_PROTOCOL", "consumer")
        .env("FLOTILLA_STATIC_MEMBERSHIP", "true");
    flotilla_tests::process::assert_refused(
        command,
        "FLOTILLA_STATIC_MEMBERSHIP=true",
        "FLOTILLA_GROUP_PROTOCOL=consumer",
    );
}

/// A pass-through property may not reach what Flotilla pins for its
/// guarantees, whatever librdkafka name it uses: refused at start-up, by
/// name, before anything is reached.
#[test]
fn pinned_kafka_settings_and_their_aliases_are_refused_at_start_up_by_name() {
    for property in [
        "acks=1",
        "request.required.acks=0",
        "delivery.timeout.ms=1",
        "isolation.level=read_uncommitted",
        "partitioner=random",
    ] {
        let mut command = worker("postgres://postgres@127.0.0.1:1/none");
        command.args(["--kafka-property", property]);
        let key = property.split_once('=').unwrap().0;
        flotilla_tests::process::assert_refused(command, key, "cannot be overridden");
    }
    let file = std::env::temp_dir().join(format!("pinned-{}.properties", uuid::Uuid::new_v4()));
    std::fs::write(&file, "enable.auto.commit=true\n").unwrap();
    let mut command = worker("postgres://postgres@127.0.0.1:1/none");
    command.env("FLOTILLA_KAFKA_PROPERTIES_FILE", &file);
    flotilla_tests::process::assert_refused(command, "enable.auto.commit", "cannot be overridden");
    std::fs::remove_file(file).unwrap();
}

/// A cluster whose admin API does not answer (like an account without the
/// right to create topics) does not stop a worker whose topics exist: they
/// are read from the metadata, and CreateTopics is never sent for them. On
/// librdkafka's mock cluster, whose admin API never answers: Apache Kafka
/// would need an authorizer and ACLs to refuse it.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn existing_topics_are_not_created_again_so_start_up_needs_no_admin_rights(pool: PgPool) {
    let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
    let topic = flotilla_tests::unique("existing-requests");
    let signals = flotilla_tests::unique("existing-signals");
    for name in [
        topic.clone(),
        flotilla_contracts::topics::dead_letter_topic(&topic),
        signals.clone(),
        flotilla_contracts::topics::dead_letter_topic(&signals),
    ] {
        cluster.create_topic(&name, 1, 1).unwrap();
    }
    let mut command = worker(&flotilla_tests::database::url_of(&pool).await);
    command
        .env("KAFKA_BOOTSTRAP_SERVERS", cluster.bootstrap_servers())
        .env("FLOTILLA_REQUEST_TOPIC", &topic)
        .env("FLOTILLA_SIGNAL_TOPIC", &signals)
        .env("FLOTILLA_CREATE_TOPICS", "true");
    let mut running = tokio::task::spawn_blocking(move || {
        let mut running = Running::start(command);
        running.wait_for_line("worker ready", Duration::from_secs(60));
        running
    })
    .await
    .unwrap();
    assert!(
        !running.output.iter().any(|l| l.contains("topic created")),
        "{}",
        running.output.join("\n")
    );
    let status = tokio::task::spawn_blocking(move || {
        let status = running.terminate(Duration::from_secs(30));
        (status, running)
    })
    .await
    .unwrap();
    assert!(status.0.success(), "{}", status.1.output.join("\n"));
    drop(cluster);
}

/// With topic creation off and the dead-letter topic missing, every bad
/// request would pause its partition: the worker refuses to start, naming
/// the topic.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_missing_dead_letter_topic_with_creation_off_fails_start_up_naming_it(pool: PgPool) {
    let topic = flotilla_tests::unique("no-dlq-requests");
    flotilla_tests::create_topic(&topic, 1).await.unwrap();
    let mut command = worker(&flotilla_tests::database::url_of(&pool).await);
    command
        .env(
            "KAFKA_BOOTSTRAP_SERVERS",
            flotilla_tests::bootstrap_servers(),
        )
        .env("FLOTILLA_REQUEST_TOPIC", &topic)
        .env("FLOTILLA_CREATE_TOPICS", "false");
    let dead_letters = flotilla_contracts::topics::dead_letter_topic(&topic);
    tokio::task::spawn_blocking(move || {
        flotilla_tests::process::assert_refused(command, &dead_letters, "does not exist");
    })
    .await
    .unwrap();
}

/// A flood of `/readyz` probes opens no connection to the broker (readiness
/// reads the consumer's own state) and costs the database no round trip per
/// probe (a background ping every 2 s): counted at a proxy in front of the
/// broker and in the database's transaction counter.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_flood_of_readyz_opens_no_kafka_connection_and_no_database_round_trip_per_probe(
    pool: PgPool,
) {
    let broker = tokio::net::lookup_host(flotilla_tests::bootstrap_servers())
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = flotilla_tests::proxy::Proxy::start(broker).await;
    let url = flotilla_tests::database::url_of(&pool).await;
    let database: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut command = worker(&url);
    command.env("KAFKA_BOOTSTRAP_SERVERS", proxy.address().to_string());
    let running = tokio::task::spawn_blocking(move || {
        let mut running = Running::start(command);
        running.wait_for_line("worker ready", Duration::from_secs(60));
        running
    })
    .await
    .unwrap();
    let api = format!(
        "http://{}",
        running
            .logged("worker ready", "api")
            .expect("the API's address")
    );
    let client = flotilla_runtime::tls::http_client().build().unwrap();
    // The consumer settles into its connections first.
    let ready = |client: reqwest::Client, api: String| async move {
        client
            .get(format!("{api}/readyz"))
            .send()
            .await
            .unwrap()
            .status()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while ready(client.clone(), api.clone()).await != reqwest::StatusCode::OK {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let commits = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1",
        )
        .bind(&database)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let (connections, transactions) = (proxy.connections(), commits().await);
    let started = std::time::Instant::now();
    for _ in 0..500 {
        assert_eq!(
            ready(client.clone(), api.clone()).await,
            reqwest::StatusCode::OK
        );
    }
    let took = started.elapsed();
    assert_eq!(
        proxy.connections(),
        connections,
        "a probe opened a broker connection"
    );
    // The counter lags a little behind the backends; the flood itself
    // would add 500.
    let added = commits().await - transactions;
    assert!(
        added < 100,
        "{added} transactions during 500 probes in {took:?}"
    );
    drop(running);
}

/// A job whose step outlasts the shutdown grace is handed back by the
/// exiting worker itself (QUEUED at once, attempt unspent, no lapse), and
/// only then does the worker leave the fleet: the binary gives its claim
/// loops the time to do it after the grace.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_step_that_outlasts_the_grace_is_handed_back_by_the_exiting_worker(pool: PgPool) {
    // A target that takes the call and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let (seen, mut calls) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
            let _ = seen.send(());
        }
    });
    let dir = std::env::temp_dir().join(format!("flotilla-binary-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        format!("targets:\n  svc:\n    kind: http\n    base_url: {url}\n    timeout_ms: 60000\n"),
    )
    .unwrap();
    let workflow = serde_json::json!({
        "name": "stuck", "input_schema": {}, "deadline_ms": 120_000,
        "steps": [{"name": "call", "target": "svc", "method": "wait"}]
    });
    std::fs::write(dir.join("workflows/stuck.json"), workflow.to_string()).unwrap();
    let url_of_database = flotilla_tests::database::url_of(&pool).await;
    let mut command = worker(&url_of_database);
    command
        .env("FLOTILLA_CONSUME_REQUESTS", "false")
        .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
        .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"))
        .env("FLOTILLA_SHUTDOWN_GRACE", "1s");
    let running = tokio::task::spawn_blocking(move || {
        let mut running = Running::start(command);
        running.wait_for_line("worker ready", Duration::from_secs(60));
        running
    })
    .await
    .unwrap();
    let job_id = submit_through(&running, "stuck").await;
    tokio::time::timeout(Duration::from_secs(30), calls.recv())
        .await
        .expect("the worker never called the target");
    let (status, output) = tokio::task::spawn_blocking(move || {
        let mut running = running;
        let status = running.terminate(Duration::from_secs(30));
        (status, running.output.join("\n"))
    })
    .await
    .unwrap();
    assert!(status.success(), "exit {status}:\n{output}");
    let (state, attempt, losses, error): (String, i32, i32, Option<String>) = sqlx::query_as(
        "SELECT status, attempt, lease_losses, error FROM workflow_run WHERE job_id = $1",
    )
    .bind(job_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (state.as_str(), attempt, losses),
        ("QUEUED", 0, 0),
        "{output}"
    );
    assert!(
        error.unwrap_or_default().contains("shutdown grace"),
        "{output}"
    );
    let members: i64 = sqlx::query_scalar("SELECT count(*) FROM worker_member")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(members, 0, "the worker left the fleet after handing back");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A timer outlives the worker that set it: a job asleep on a 4 s timer
/// whose worker is SIGKILLed is woken by another worker once, at the
/// stored instant (late by no more than its claim loop's idle poll and
/// start-up, not by the wait again).
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_timer_survives_a_sigkilled_worker_and_fires_once_on_time(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("flotilla-binary-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    let workflow = serde_json::json!({
        "name": "napper", "input_schema": {},
        "steps": [{"name": "nap", "sleep": "4s"}]
    });
    std::fs::write(dir.join("workflows/napper.json"), workflow.to_string()).unwrap();
    let database = flotilla_tests::database::url_of(&pool).await;
    let start = |id: &str| {
        let mut command = worker(&database);
        command
            .env("FLOTILLA_WORKER_ID", id)
            .env("FLOTILLA_CONSUME_REQUESTS", "false")
            .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"))
            .env("FLOTILLA_IDLE_POLL_MAX", "200ms");
        ready(command)
    };
    let first = start("timer-first").await;
    let job_id = submit_through(&first, "napper").await;

    let state = || async {
        sqlx::query_as::<
            _,
            (
                String,
                chrono::DateTime<chrono::Utc>,
                Option<serde_json::Value>,
            ),
        >("SELECT status, run_after, timers FROM workflow_run WHERE job_id = $1")
        .bind(job_id)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let wakes = loop {
        let (status, run_after, timers) = state().await;
        if status == "QUEUED" && timers.is_some() {
            break run_after;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job never went to sleep"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    kill(first).await;

    let second = start("timer-second").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, _) = state().await;
        if status == "COMPLETED" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the timer never fired: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The checkpoints as the API gives them (rows of their own included).
    let api = api_of(&second);
    let done: serde_json::Value = flotilla_runtime::tls::http_client()
        .build()
        .unwrap()
        .get(format!("{api}/v1/jobs/{job_id}"))
        .bearer_auth("test-token")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let checkpoints = &done["checkpoints"];
    let completed: chrono::DateTime<chrono::Utc> =
        done["updated_at"].as_str().unwrap().parse().unwrap();
    let fired = checkpoints.as_array().unwrap();
    assert_eq!(fired.len(), 1, "fired once: {checkpoints}");
    let woke_at: chrono::DateTime<chrono::Utc> = fired[0]["response"]["woke_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        woke_at, wakes,
        "woken at the instant stored, not a new wait"
    );
    let late = (completed - wakes)
        .to_std()
        .expect("not before its instant");
    assert!(
        late < Duration::from_secs(2),
        "woken {late:?} after its instant"
    );
    println!("timer fired {late:?} after its instant, on a second worker");
    tokio::task::spawn_blocking(move || {
        let mut second = second;
        second.terminate(Duration::from_secs(30));
    })
    .await
    .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A parent whose worker is SIGKILLed right after it started a child (its
/// other branch still calling a slow target) is resumed by another worker,
/// which waits for that child instead of starting a second one.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_parent_sigkilled_while_it_starts_a_child_never_starts_two(pool: PgPool) {
    let (url, _calls) = slow_service(Duration::from_secs(3)).await;
    let dir = std::env::temp_dir().join(format!("flotilla-binary-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        format!("targets:\n  svc:\n    kind: http\n    base_url: {url}\n"),
    )
    .unwrap();
    let kid = serde_json::json!({
        "name": "kid", "input_schema": {},
        "steps": [{"name": "nap", "sleep": "1s"}]
    });
    let family = serde_json::json!({
        "name": "family", "input_schema": {},
        "steps": [
            {"name": "spawn", "needs": [], "start": {"workflow": "kid"}},
            {"name": "call", "needs": [], "target": "svc", "method": "slow"}
        ]
    });
    std::fs::write(dir.join("workflows/kid.json"), kid.to_string()).unwrap();
    std::fs::write(dir.join("workflows/family.json"), family.to_string()).unwrap();
    let database = flotilla_tests::database::url_of(&pool).await;
    let start = |id: &str| {
        let mut command = worker(&database);
        command
            .env("FLOTILLA_WORKER_ID", id)
            .env("FLOTILLA_CONSUME_REQUESTS", "false")
            .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
            .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"))
            .env("FLOTILLA_LEASE", "2s")
            .env("FLOTILLA_SWEEP_INTERVAL", "200ms")
            .env("FLOTILLA_IDLE_POLL_MAX", "200ms");
        ready(command)
    };
    let first = start("family-first").await;
    let parent = submit_through(&first, "family").await;
    let children = || async {
        sqlx::query_as::<_, (uuid::Uuid, String)>(
            "SELECT job_id, status FROM workflow_run WHERE parent_job_id = $1",
        )
        .bind(parent)
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while children().await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no child was started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    kill(first).await;

    let _second = start("family-second").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status,): (String,) =
            sqlx::query_as("SELECT status FROM workflow_run WHERE job_id = $1")
                .bind(parent)
                .fetch_one(&pool)
                .await
                .unwrap();
        if status == "COMPLETED" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the parent never completed: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let kids = children().await;
    assert_eq!(kids.len(), 1, "one child, ever: {kids:?}");
    assert_eq!(kids[0].1, "COMPLETED");
    assert_eq!(
        kids[0].0,
        flotilla_worker::engine::child_id(parent, "spawn")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
