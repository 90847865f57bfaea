//! One trace from the producer to the last lifecycle event: a request
//! produced with a known `traceparent` runs through a retry, a park, an
//! answer given to another worker and a resume there, and a relay; all
//! export to an OTLP/HTTP receiver made here (a real endpoint decoding the
//! protobuf payloads). The spans form one tree under the producer's span:
//! the consumer span, a segment span per claim (on both workers), a client
//! span per step call (whose context is the `traceparent` the target
//! receives), the complete-step span, and a producer span per published
//! event (whose context is the event's header).

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use flotilla_tests::process::Running;
use flotilla_tests::{close_consumer, unique};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use rdkafka::Message as _;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Header, Headers as _, OwnedHeaders};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";
const TRACESTATE: &str = "vendor=opaque-value";

/// A span as received: its ids in hex, its parent, kind, name, attributes.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    trace_id: String,
    span_id: String,
    parent: String,
    kind: SpanKind,
    name: String,
    attributes: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Received>>>);

async fn traces(State(receiver): State<Receiver>, body: Bytes) -> &'static str {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf payload");
    let mut spans = receiver.0.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .map(|a| format!("{:?}", a.value))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                spans.push(Received {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    kind: SpanKind::try_from(span.kind).unwrap_or(SpanKind::Unspecified),
                    name: span.name.clone(),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), format!("{:?}", a.value)))
                        .collect(),
                });
            }
        }
    }
    ""
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn start_receiver() -> (String, Receiver) {
    let receiver = Receiver::default();
    let app = axum::Router::new()
        .route("/v1/traces", post(traces))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, receiver)
}

/// A target that keeps the `traceparent` of every call, and answers the
/// first call of `flaky` 503 (so the job retries).
async fn start_target(seen: Arc<Mutex<Vec<String>>>) -> String {
    let app = axum::Router::new().route(
        "/{m}",
        post(
            move |axum::extract::Path(method): axum::extract::Path<String>, headers: HeaderMap| {
                let seen = seen.clone();
                async move {
                    let mut seen = seen.lock().unwrap();
                    if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
                        let state = headers.get("tracestate").and_then(|v| v.to_str().ok());
                        seen.push(format!("{tp} {}", state.unwrap_or("-")));
                    }
                    if method == "flaky" && seen.len() == 1 {
                        return (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            axum::Json(json!({"busy": true})),
                        );
                    }
                    (axum::http::StatusCode::OK, axum::Json(json!({"ok": true})))
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn one_job_is_one_trace_under_the_producers_span(pool: PgPool) {
    tokio::time::timeout(Duration::from_secs(120), one_trace(pool))
        .await
        .expect("the traced run timed out");
}

#[allow(clippy::too_many_lines)]
async fn one_trace(pool: PgPool) {
    let (otlp, receiver) = start_receiver().await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let target = start_target(calls.clone()).await;
    let dir = std::env::temp_dir().join(format!("flotilla-traced-{}", Uuid::new_v4()));
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        format!("targets:\n  t:\n    kind: http\n    base_url: {target}\n"),
    )
    .unwrap();
    let workflow = json!({"name": "traced", "input_schema": {}, "steps": [
        {"name": "one", "target": "t", "method": "flaky"},
        {"name": "approve", "target": "t", "method": "approve", "completion": "external"},
        {"name": "two", "target": "t", "method": "two"}]});
    std::fs::write(dir.join("workflows/traced.json"), workflow.to_string()).unwrap();
    let (requests, events) = (unique("traced-requests"), unique("traced-events"));
    let database = flotilla_tests::database::url_of(&pool).await;
    let otel = |command: &mut Command| {
        command
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env("DATABASE_URL", &database)
            .env(
                "KAFKA_BOOTSTRAP_SERVERS",
                flotilla_tests::bootstrap_servers(),
            )
            .env("SCHEMA_REGISTRY_URL", "")
            .env("NO_COLOR", "1");
    };
    let group = unique("traced-workers");
    let second_api = format!("127.0.0.1:{}", flotilla_tests::free_port());
    let worker_command = |id: &str, api: &str| {
        let mut worker = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
        otel(&mut worker);
        worker
            .env("FLOTILLA_WORKER_ID", id)
            .env("FLOTILLA_HTTP_ADDR", api)
            .env("FLOTILLA_API_TOKENS", "t")
            .env("FLOTILLA_BACKOFF_BASE", "100ms")
            .env("FLOTILLA_REQUEST_TOPIC", &requests)
            .env("FLOTILLA_CONSUMER_GROUP", &group)
            .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
            .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"));
        worker
    };
    let worker = worker_command("traced-worker-1", "127.0.0.1:0");
    let second = worker_command("traced-worker-2", &second_api);
    let mut relay = Command::new(flotilla_tests::process::workspace_binary("flotilla-relay"));
    otel(&mut relay);
    relay
        .env("FLOTILLA_EVENT_TOPIC", &events)
        .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0");
    let (mut worker, mut relay) = tokio::task::spawn_blocking(move || {
        let mut worker = Running::start(worker);
        worker.wait_for_line("worker ready", Duration::from_secs(60));
        let mut relay = Running::start(relay);
        relay.wait_for_line("relay ready", Duration::from_secs(60));
        (worker, relay)
    })
    .await
    .unwrap();

    // The producer's span, as an outside client would send it.
    let job = Uuid::new_v4();
    let producer: rdkafka::producer::FutureProducer = flotilla_tests::broker()
        .idempotent_producer()
        .create()
        .unwrap();
    let request = flotilla_contracts::WorkflowRunRequest::new(job, "traced", json!({})).unwrap();
    let payload = flotilla_contracts::json::encode(&request).unwrap();
    let key = job.to_string();
    let traceparent = format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01");
    producer
        .send(
            rdkafka::producer::FutureRecord::to(&requests)
                .key(&key)
                .payload(&payload)
                .headers(
                    OwnedHeaders::new()
                        .insert(Header {
                            key: "traceparent",
                            value: Some(traceparent.as_bytes()),
                        })
                        .insert(Header {
                            key: "tracestate",
                            value: Some(TRACESTATE.as_bytes()),
                        }),
                ),
            Duration::from_secs(10),
        )
        .await
        .unwrap();

    // The first worker retries the flaky step and parks the job; then it
    // stops, and the answer goes to a second worker, which resumes the job.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM workflow_run WHERE job_id = $1")
                .bind(job)
                .fetch_optional(&pool)
                .await
                .unwrap();
        if status.as_deref() == Some("WAITING") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the job never parked: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (worker, mut second) = tokio::task::spawn_blocking(move || {
        worker.terminate(Duration::from_secs(30));
        let mut second = Running::start(second);
        second.wait_for_line("worker ready", Duration::from_secs(60));
        (worker, second)
    })
    .await
    .unwrap();
    let answered = flotilla_runtime::tls::http_client()
        .build()
        .unwrap()
        .post(format!(
            "http://{second_api}/v1/jobs/{job}/steps/approve/complete"
        ))
        .bearer_auth("t")
        .json(&json!({"response": {"approved": true}}))
        .send()
        .await
        .unwrap();
    assert!(answered.status().is_success(), "{answered:?}");

    // Every event of the job on the topic; the headers say which span sent each.
    let consumer: StreamConsumer = flotilla_tests::broker()
        .manual_commit_consumer(&unique("traced-reader"))
        .create()
        .unwrap();
    consumer.subscribe(&[&events]).unwrap();
    let mut event_parents = Vec::new();
    loop {
        let message = consumer.recv().await.unwrap();
        let event: flotilla_contracts::WorkflowRunEvent =
            flotilla_contracts::json::decode(message.payload().unwrap()).unwrap();
        let header = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "traceparent"))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .expect("every event carries a traceparent");
        assert!(header.contains(TRACE_ID), "{header}");
        let state = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "tracestate"))
            .and_then(|h| h.value);
        assert_eq!(
            state,
            Some(TRACESTATE.as_bytes()),
            "tracestate travels to events"
        );
        event_parents.push(header[36..52].to_owned());
        if event.event_type() == flotilla_contracts::WorkflowRunEventType::Completed {
            break;
        }
    }
    close_consumer(consumer);

    // Stop the rest (flushing their spans), then read the tree.
    drop(worker);
    tokio::task::spawn_blocking(move || {
        second.terminate(Duration::from_secs(30));
        relay.terminate(Duration::from_secs(30));
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans: Vec<Received> = loop {
        let spans: Vec<Received> = receiver
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == TRACE_ID)
            .cloned()
            .collect();
        let sends = spans
            .iter()
            .filter(|s| s.kind == SpanKind::Producer)
            .count();
        if sends >= event_parents.len() || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let by_id: HashMap<&str, &Received> = spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let of_kind = |kind| spans.iter().filter(move |s| s.kind == kind);

    let process: Vec<&Received> = of_kind(SpanKind::Consumer).collect();
    assert_eq!(process.len(), 1, "one consumer span: {spans:#?}");
    let process = process[0];
    assert_eq!(
        process.parent, PRODUCER_SPAN,
        "the consumer span continues the producer's"
    );
    for attribute in [
        "messaging.system",
        "messaging.destination.name",
        "messaging.destination.partition.id",
        "messaging.kafka.offset",
        "messaging.consumer.group.name",
        "messaging.kafka.message.key",
    ] {
        assert!(
            process.attributes.contains_key(attribute),
            "{attribute}: {process:#?}"
        );
    }
    assert!(process.service.contains("flotilla-worker"), "{process:#?}");

    let segments: Vec<&Received> = spans.iter().filter(|s| s.name == "run traced").collect();
    for segment in &segments {
        assert_eq!(
            segment.parent, process.span_id,
            "segments hang under the consumer span"
        );
    }
    // The retry, the park and the resume: segments on both workers.
    for worker in ["traced-worker-1", "traced-worker-2"] {
        assert!(
            segments.iter().any(|s| s
                .attributes
                .get("worker_id")
                .is_some_and(|w| w.contains(worker))),
            "a segment on {worker}: {segments:#?}"
        );
    }
    assert!(segments.len() >= 3, "retry, park, resume: {segments:#?}");
    let answer: Vec<&Received> = spans
        .iter()
        .filter(|s| s.name == "complete approve")
        .collect();
    assert_eq!(answer.len(), 1, "{spans:#?}");
    assert_eq!(
        answer[0].parent, process.span_id,
        "the answer joins the job's trace"
    );
    let steps: Vec<&Received> = of_kind(SpanKind::Client).collect();
    assert_eq!(
        steps.len(),
        3,
        "one client span per step call (flaky twice): {spans:#?}"
    );
    for step in &steps {
        assert!(
            segments.iter().any(|s| s.span_id == step.parent),
            "a step call hangs under its segment: {step:#?}"
        );
        for attribute in [
            "flotilla.step",
            "flotilla.target",
            "flotilla.outcome",
            "job_id",
        ] {
            assert!(
                step.attributes.contains_key(attribute),
                "{attribute}: {step:#?}"
            );
        }
    }
    // The target saw the step span as its caller, not the submitter.
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 3);
    for call in &calls {
        let caller = &call[36..52];
        assert!(call.contains(TRACE_ID));
        assert!(
            call.ends_with(TRACESTATE),
            "tracestate travels to targets: {call}"
        );
        assert_eq!(by_id[caller].kind, SpanKind::Client, "{call}");
    }
    // Every event's header names the relay's producer span that sent it.
    for parent in &event_parents {
        let send = by_id
            .get(parent.as_str())
            .unwrap_or_else(|| panic!("no exported span {parent}: {spans:#?}"));
        assert_eq!(send.kind, SpanKind::Producer);
        assert_eq!(
            send.parent, process.span_id,
            "sends hang under the consumer span"
        );
        assert!(send.service.contains("flotilla-relay"), "{send:#?}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// `/metrics` parses as Prometheus text (with a real parser) and the job
/// counters, claims and step histograms move as a job runs; a job submitted
/// through the API with a `traceparent` keeps it (its events carry it).
#[sqlx::test(migrator = "MIGRATOR")]
async fn metrics_parse_and_move_as_jobs_run(pool: PgPool) {
    use flotilla_worker::test_support::{TEST_TOKEN, TestApp};

    let app = TestApp::spawn(pool.clone()).await;
    let client = flotilla_runtime::tls::http_client().build().unwrap();
    let workflow = format!("metered_{}", Uuid::new_v4().simple());
    let definition = json!({"name": workflow, "input_schema": {},
        "steps": [{"name": "s", "target": "echo", "method": "m"}]});
    client
        .put(format!("{}/v1/workflows/{workflow}", app.url))
        .bearer_auth(TEST_TOKEN)
        .json(&definition)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let scrape = || async {
        let text = client
            .get(format!("{}/metrics", app.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
            .expect("Prometheus text format")
    };
    let value_of = |scrape: &prometheus_parse::Scrape, name: &str| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && s.labels.get("workflow") == Some(workflow.as_str()))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                _ => 0.0,
            })
            .sum()
    };

    let traceparent = format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01");
    let job = Uuid::new_v4();
    client
        .post(format!("{}/v1/jobs", app.url))
        .bearer_auth(TEST_TOKEN)
        .header("traceparent", &traceparent)
        .json(&json!({"workflow_name": workflow, "input": {}, "job_id": job}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let scrape = scrape().await;
        if value_of(&scrape, "flotilla_jobs_completed_total") >= 1.0 {
            break scrape;
        }
        assert!(Instant::now() < deadline, "the job never completed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(value_of(&after, "flotilla_jobs_submitted_total"), 1.0);
    for histogram in [
        "flotilla_step_duration_seconds",
        "flotilla_job_duration_seconds",
        "flotilla_queue_to_claim_seconds",
    ] {
        assert!(
            after.samples.iter().any(|s| s.metric == histogram
                && matches!(s.value, prometheus_parse::Value::Histogram(_))),
            "{histogram} is a histogram: {:?}",
            after.samples.iter().map(|s| &s.metric).collect::<Vec<_>>()
        );
    }
    for gauge in [
        "flotilla_db_pool_connections",
        "flotilla_tasks_dead",
        "flotilla_claims_total",
    ] {
        assert!(after.samples.iter().any(|s| s.metric == gauge), "{gauge}");
    }
    let stored: Option<String> =
        sqlx::query_scalar("SELECT traceparent FROM workflow_run_outbox WHERE job_id = $1 LIMIT 1")
            .bind(job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored.as_deref(), Some(traceparent.as_str()));
    app.stop().await;
}
