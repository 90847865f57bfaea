//! A step whose target is a pair of Kafka topics, end to end on the test
//! broker: the worker and relay binaries, and a responder in the test that
//! reads the requests and answers on the reply topic, as a service would.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use flotilla_contracts::{WorkflowRunRequest, WorkflowStepReply, WorkflowStepRequest};
use flotilla_tests::process::Running;
use flotilla_tests::{KAFKA_TEST_TIMEOUT, bootstrap_servers, close_consumer, unique};
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::Headers as _;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message as _};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

const BINARY: &str = env!("CARGO_BIN_EXE_flotilla-worker");

/// An HTTP target answering every call with the request it got.
async fn echo_service() -> String {
    use axum::routing::post;
    let echo = |axum::Json(body): axum::Json<serde_json::Value>| async move {
        axum::Json(json!({ "request": body }))
    };
    let app = axum::Router::new()
        .route("/prepare", post(echo))
        .route("/decide", post(echo));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers())
        .create()
        .unwrap()
}

async fn produce(producer: &FutureProducer, topic: &str, key: &str, payload: &[u8]) {
    producer
        .send(
            FutureRecord::to(topic).key(key).payload(payload),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

/// Reads one step request off `topic`: the request and its headers.
async fn next_request(consumer: &StreamConsumer) -> (WorkflowStepRequest, HashMap<String, String>) {
    let message = consumer.recv().await.unwrap();
    let request: WorkflowStepRequest =
        flotilla_contracts::json::decode(message.payload().unwrap()).unwrap();
    let headers = message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| {
                    (
                        h.key.to_owned(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (request, headers)
}

/// prepare (http) → score (Kafka: request and reply topics of the test's
/// own) → decide (http).
fn scoring() -> serde_json::Value {
    json!({
        "name": "scoring", "input_schema": {},
        "steps": [
            {"name": "prepare", "target": "svc", "method": "prepare"},
            {"name": "score", "target": "fraud", "method": "score",
             "rules": ["amount = input.amount"],
             "output_schema": {"type": "object", "required": ["risk"]}},
            {"name": "decide", "target": "svc", "method": "decide",
             "rules": ["risk = steps.score.risk"]}
        ],
        "output": ["risk = steps.decide.request.risk"]
    })
}

/// A worker and a relay (binaries) with the `scoring` workflow, on topics of
/// their own; Avro through the registry when `avro`, JSON otherwise.
struct Fleet {
    worker: Option<Running>,
    /// `None` until [`Fleet::start_relay`] when started without one.
    relay: Option<Running>,
    relay_command: Option<Command>,
    dir: std::path::PathBuf,
    /// The run requests' topic, and the Kafka target's two.
    run_requests: String,
    requests: String,
    replies: String,
    /// The request consumer's group (the reply consumer's is `<it>-replies`).
    group: String,
}

impl Fleet {
    async fn start(pool: &PgPool, avro: bool) -> Self {
        let mut fleet = Self::without_relay(pool, avro).await;
        fleet.start_relay().await;
        fleet
    }

    /// The worker alone: requests wait in the outbox until a relay runs.
    async fn without_relay(pool: &PgPool, avro: bool) -> Self {
        let url = echo_service().await;
        let (requests, replies) = (unique("fraud-requests"), unique("fraud-replies"));
        let run_requests = unique("kt-requests");
        let group = unique("kt-workers");
        let dir = std::env::temp_dir().join(format!("flotilla-kafka-target-{}", Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("workflows")).unwrap();
        std::fs::write(
            dir.join("targets.yaml"),
            format!(
                "targets:\n  svc:\n    kind: http\n    base_url: {url}\n  fraud:\n    kind: kafka\n    request_topic: {requests}\n    reply_topic: {replies}\n    timeout_ms: 60000\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.join("workflows/scoring.json"), scoring().to_string()).unwrap();
        let database = flotilla_tests::database::url_of(pool).await;
        let registry = |command: &mut Command| {
            if avro {
                command.env("SCHEMA_REGISTRY_URL", flotilla_tests::schema_registry_url());
            } else {
                command.env_remove("SCHEMA_REGISTRY_URL");
            }
        };
        let mut worker = Command::new(BINARY);
        worker
            .env("DATABASE_URL", &database)
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
            .env("FLOTILLA_WORKER_ID", unique("kafka-target-worker"))
            .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
            .env("FLOTILLA_API_TOKENS", "test-token")
            .env("FLOTILLA_REQUEST_TOPIC", &run_requests)
            .env("FLOTILLA_CONSUMER_GROUP", &group)
            .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
            .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"))
            .env("NO_COLOR", "1");
        registry(&mut worker);
        let mut relay = Command::new(flotilla_tests::process::workspace_binary("flotilla-relay"));
        relay
            .env("DATABASE_URL", &database)
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
            .env("FLOTILLA_EVENT_TOPIC", unique("kt-events"))
            .env("FLOTILLA_RELAY_ID", unique("kafka-target-relay"))
            .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0")
            .env("NO_COLOR", "1");
        registry(&mut relay);
        let worker = tokio::task::spawn_blocking(move || {
            let mut worker = Running::start(worker);
            worker.wait_for_line("worker ready", Duration::from_secs(60));
            worker
        })
        .await
        .unwrap();
        Self {
            worker: Some(worker),
            relay: None,
            relay_command: Some(relay),
            dir,
            run_requests,
            requests,
            replies,
            group,
        }
    }

    /// Produces a run request of `scoring` for `amount`, with a trace of its
    /// own; returns the job id and the trace id.
    async fn submit(&self, producer: &FutureProducer, amount: i64) -> (Uuid, String) {
        let job_id = Uuid::new_v4();
        let request =
            WorkflowRunRequest::new(job_id, "scoring", json!({"amount": amount})).unwrap();
        let trace_id = format!("{:032x}", job_id.as_u128());
        let traceparent = format!("00-{trace_id}-00f067aa0ba902b7-01");
        let payload = flotilla_contracts::json::encode(&request).unwrap();
        let key = job_id.to_string();
        producer
            .send(
                FutureRecord::to(&self.run_requests)
                    .key(&key)
                    .payload(&payload)
                    .headers(rdkafka::message::OwnedHeaders::new().insert(
                        rdkafka::message::Header {
                            key: "traceparent",
                            value: Some(traceparent.as_bytes()),
                        },
                    )),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        (job_id, trace_id)
    }

    async fn start_relay(&mut self) {
        let command = self.relay_command.take().expect("the relay runs already");
        let relay = tokio::task::spawn_blocking(move || {
            let mut relay = Running::start(command);
            relay.wait_for_line("relay ready", Duration::from_secs(60));
            relay
        })
        .await
        .unwrap();
        self.relay = Some(relay);
    }

    /// The service behind the Kafka target: reads its requests from the start.
    fn service(&self) -> StreamConsumer {
        let responder: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers())
            .set("group.id", unique("fraud-service"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        responder.subscribe(&[self.requests.as_str()]).unwrap();
        responder
    }

    /// SIGKILLs the worker: no hand-back, no goodbye.
    async fn kill_worker(&mut self) {
        let mut worker = self.worker.take().expect("the worker runs");
        tokio::task::spawn_blocking(move || worker.kill())
            .await
            .unwrap();
    }

    async fn stop(self) {
        let Self {
            worker, relay, dir, ..
        } = self;
        tokio::task::spawn_blocking(move || {
            for mut process in [worker, relay].into_iter().flatten() {
                assert!(process.terminate(Duration::from_secs(30)).success());
            }
        })
        .await
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// How many records `topic` holds, over its partitions (0 while it has
/// none), and how many of them `group` committed, when a group is named.
async fn records_on_and_committed(topic: &str, group: Option<&str>) -> (i64, i64) {
    let (topic, group) = (topic.to_owned(), group.map(str::to_owned));
    tokio::task::spawn_blocking(move || {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap_servers());
        if let Some(group) = &group {
            config.set("group.id", group);
        }
        let reader: rdkafka::consumer::BaseConsumer = config.create().unwrap();
        let partitions = reader
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .map(|m| m.topics().first().map_or(0, |t| t.partitions().len()))
            .unwrap_or(0);
        let partitions = 0..i32::try_from(partitions).unwrap();
        let records = partitions
            .clone()
            .map(|p| {
                reader
                    .fetch_watermarks(&topic, p, Duration::from_secs(10))
                    .map_or(0, |(low, high)| high - low)
            })
            .sum();
        let committed = match group {
            None => 0,
            Some(_) => {
                let mut list = rdkafka::TopicPartitionList::new();
                for p in partitions {
                    list.add_partition(&topic, p);
                }
                let committed = reader
                    .committed_offsets(list, Duration::from_secs(10))
                    .unwrap();
                committed
                    .elements()
                    .iter()
                    .map(|e| match e.offset() {
                        rdkafka::Offset::Offset(o) => o,
                        _ => 0,
                    })
                    .sum()
            }
        };
        (records, committed)
    })
    .await
    .unwrap()
}

async fn records_on(topic: &str) -> i64 {
    records_on_and_committed(topic, None).await.0
}

/// Polls until `job_id` is COMPLETED; its result.
async fn completed(pool: &PgPool, job_id: Uuid) -> Option<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let row: Option<(String, Option<serde_json::Value>)> =
            sqlx::query_as("SELECT status, result FROM workflow_run WHERE job_id = $1")
                .bind(job_id)
                .fetch_optional(pool)
                .await
                .unwrap();
        if let Some((status, result)) = &row
            && status == "COMPLETED"
        {
            return result.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job never completed: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A responder in the test answers the request (after a reply that does not
/// decode, which is dead-lettered) and sends its answer twice: the job
/// completes once with the answer. JSON on the wire.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_three_step_workflow_whose_middle_step_is_a_kafka_target_completes_end_to_end(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let fleet = Fleet::start(&pool, false).await;
        let responder = fleet.service();
        let producer = producer();
        let (job_id, trace_id) = fleet.submit(&producer, 250).await;
        let key = job_id.to_string();

        let (asked, headers) = next_request(&responder).await;
        assert_eq!(asked.job_id(), job_id);
        assert_eq!(asked.step_name(), "score");
        assert_eq!(asked.request(), &json!({"amount": 250}));
        assert_eq!(asked.reply_topic(), fleet.replies);
        let correlation = asked.correlation_id().to_string();
        for (name, value) in [
            ("flotilla.job-id", key.as_str()),
            ("flotilla.step", "score"),
            ("flotilla.correlation-id", correlation.as_str()),
            ("flotilla.reply-topic", fleet.replies.as_str()),
            ("idempotency-key", format!("{job_id}:score").as_str()),
        ] {
            assert_eq!(headers.get(name).map(String::as_str), Some(value), "{headers:?}");
        }
        assert!(
            headers
                .get("traceparent")
                .is_some_and(|sent| sent.contains(&trace_id)),
            "the request continues the job's trace: {headers:?}"
        );

        produce(&producer, &fleet.replies, &key, b"{not a reply").await;
        let answer = WorkflowStepReply::answer(job_id, asked.correlation_id(), json!({"risk": 0.5}))
            .unwrap();
        let answer = flotilla_contracts::json::encode(&answer).unwrap();
        produce(&producer, &fleet.replies, &key, &answer).await;
        produce(&producer, &fleet.replies, &key, &answer).await;

        assert_eq!(completed(&pool, job_id).await, Some(json!({"risk": 0.5})));
        let checkpoints: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_run_outbox WHERE job_id = $1 AND event_type = 'STEP_CHECKPOINT'",
        )
        .bind(job_id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(checkpoints, 3, "one checkpoint per step, the repeated reply changed nothing");
        let unsent: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_step_request_outbox")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(unsent, 0, "the relay deleted the request it sent");

        // The reply that did not decode went to the reply topic's dead letters.
        let dead_letters = flotilla_contracts::topics::dead_letter_topic(&fleet.replies);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while records_on(&dead_letters).await < 1 {
            assert!(tokio::time::Instant::now() < deadline, "no dead letter on {dead_letters}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // The replies were read by the reply consumer, in a group of its
        // own; the request consumer's group never read the reply topic.
        let replies_group = format!("{}-replies", fleet.group);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (records, committed) =
                records_on_and_committed(&fleet.replies, Some(&replies_group)).await;
            if records == 3 && committed == 3 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{replies_group} committed {committed} of {records} replies"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (_, by_requests) = records_on_and_committed(&fleet.replies, Some(&fleet.group)).await;
        assert_eq!(by_requests, 0, "the request consumer does not read replies");

        close_consumer(responder);
        fleet.stop().await;
    })
    .await
    .expect("the Kafka target test timed out");
}

/// The Python example (`examples/python/responder.py`: confluent-kafka and
/// the registry's Avro serializer) answers a Kafka step of a fleet writing
/// Avro: the job completes with its answer.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn the_python_example_responder_answers_a_kafka_step_in_avro(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let (python, examples) = flotilla_tests::examples_python();
        let fleet = Fleet::start(&pool, true).await;
        let mut command = Command::new(python);
        command
            .arg(examples.join("python/responder.py"))
            .args(["--bootstrap", &bootstrap_servers()])
            .args(["--requests", &fleet.requests])
            .args(["--registry", &flotilla_tests::schema_registry_url()])
            .args(["--group", &unique("python-responder")])
            .args(["--max", "1"]);
        let responder = tokio::task::spawn_blocking(move || {
            let mut responder = Running::start(command);
            responder.wait_for_line("answering step requests", Duration::from_secs(60));
            responder
        })
        .await
        .unwrap();
        let (job_id, _) = fleet.submit(&producer(), 250).await;
        assert_eq!(
            completed(&pool, job_id).await,
            Some(json!({"risk": 0.5})),
            "the example's answer: 250 modulo 100, as a share"
        );
        let (status, output) = tokio::task::spawn_blocking(move || {
            let mut responder = responder;
            let status = responder.wait(Duration::from_secs(30));
            (status, responder.output.join("\n"))
        })
        .await
        .unwrap();
        assert!(status.success(), "the responder: {status}\n{output}");
        assert!(output.contains(&format!("of job {job_id}")), "{output}");
        fleet.stop().await;
    })
    .await
    .expect("the Python example test timed out");
}

/// A worker SIGKILLed once its park committed, before any relay ran: the
/// request waits in the outbox, and a relay started afterwards sends it,
/// once, with the correlation id the row keeps.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_worker_killed_between_park_and_publish_still_gets_its_request_sent(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let mut fleet = Fleet::without_relay(&pool, false).await;
        let responder = fleet.service();
        let (job_id, _) = fleet.submit(&producer(), 75).await;

        // Parked: the job waits and its request is in the outbox, unsent.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let correlation_id = loop {
            let parked: Option<(String, Option<String>)> = sqlx::query_as(
                "SELECT status, step_requests -> 'score' ->> 'correlation_id'
                 FROM workflow_run WHERE job_id = $1",
            )
            .bind(job_id)
            .fetch_optional(&pool)
            .await
            .unwrap();
            let queued: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM workflow_step_request_outbox WHERE job_id = $1",
            )
            .bind(job_id)
            .fetch_one(&pool)
            .await
            .unwrap();
            if let Some((status, Some(correlation))) = &parked
                && status == "WAITING"
                && queued == 1
            {
                break correlation.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the job never parked on its Kafka step: {parked:?}, {queued} queued"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        fleet.kill_worker().await;

        fleet.start_relay().await;
        let (asked, headers) = next_request(&responder).await;
        assert_eq!(asked.job_id(), job_id);
        assert_eq!(asked.correlation_id().to_string(), correlation_id);
        assert_eq!(
            headers.get("flotilla.correlation-id"),
            Some(&correlation_id),
            "{headers:?}"
        );
        // Sent once: the outbox row goes once acknowledged, and the topic
        // holds that one record.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_step_request_outbox")
                .fetch_one(&pool)
                .await
                .unwrap();
            if left == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the request stayed in the outbox"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let sent = records_on(&fleet.requests).await;
        assert_eq!(sent, 1, "the request was sent once");

        close_consumer(responder);
        fleet.stop().await;
    })
    .await
    .expect("the killed-worker test timed out");
}
