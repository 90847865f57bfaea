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
    record(&receiver, request);
    ""
}

/// Keeps every span of an export request.
fn record(receiver: &Receiver, request: ExportTraceServiceRequest) {
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

/// The gRPC method an OTLP/gRPC exporter calls.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// An OTLP/gRPC receiver: plaintext HTTP/2 (h2c, what the exporter speaks
/// to an `http://` endpoint), one unary method. Each message travels in a
/// gRPC frame (a compressed flag, a big-endian length); the answer is an
/// empty `ExportTraceServiceResponse` with `grpc-status: 0` in the trailers.
async fn start_grpc_receiver() -> (String, Receiver) {
    use http_body_util::BodyExt as _;
    use hyper::body::Frame;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;

    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let kept = receiver.clone();
    let export = move |request: hyper::Request<hyper::body::Incoming>| {
        let kept = kept.clone();
        async move {
            let known = request.uri().path() == GRPC_EXPORT;
            let body = request.into_body().collect().await?.to_bytes();
            let mut status = "12"; // UNIMPLEMENTED
            let mut message = Vec::new();
            if known && body.len() >= 5 && body[0] == 0 {
                let length = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
                let request = ExportTraceServiceRequest::decode(&body[5..5 + length])
                    .expect("an OTLP protobuf message");
                record(&kept, request);
                status = "0";
                message = ExportTraceServiceResponse::default().encode_to_vec();
            }
            let mut framed = vec![0u8];
            framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
            framed.extend_from_slice(&message);
            let mut trailers = hyper::HeaderMap::new();
            trailers.insert("grpc-status", status.parse().unwrap());
            let frames: Vec<Result<Frame<Bytes>, hyper::Error>> = vec![
                Ok(Frame::data(Bytes::from(framed))),
                Ok(Frame::trailers(trailers)),
            ];
            let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
            Ok::<_, hyper::Error>(
                hyper::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(body)
                    .unwrap(),
            )
        }
    };
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let connection =
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(stream),
                        hyper::service::service_fn(export.clone()),
                    );
            tokio::spawn(connection);
        }
    });
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
/// `/metrics` of the worker at `base`: the text, and its parse by a real
/// Prometheus parser.
async fn scrape(client: &reqwest::Client, base: &str) -> (String, prometheus_parse::Scrape) {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("Prometheus text format");
    (text, parsed)
}

/// The sum of `metric`'s counter and gauge samples, those labelled
/// `label=value` when a label is given.
fn sum_of(scrape: &prometheus_parse::Scrape, metric: &str, label: Option<(&str, &str)>) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| {
            s.metric == metric
                && label.is_none_or(|(label, value)| s.labels.get(label) == Some(value))
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// Scrapes `url` until `check` holds of a scrape, failing after 30 s
/// with `what`; returns that scrape.
async fn scrape_until(
    client: &reqwest::Client,
    url: &str,
    what: &str,
    check: impl Fn(&prometheus_parse::Scrape) -> bool,
) -> prometheus_parse::Scrape {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, scrape) = scrape(client, url).await;
        if check(&scrape) {
            return scrape;
        }
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

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
    let value_of = |scrape: &prometheus_parse::Scrape, name: &str| {
        sum_of(scrape, name, Some(("workflow", &workflow)))
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
    let after = scrape_until(&client, &app.url, "the job never completed", |scrape| {
        value_of(scrape, "flotilla_jobs_completed_total") >= 1.0
    })
    .await;
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

/// Spans of `trace_id` the receiver holds.
fn spans_of(receiver: &Receiver, trace_id: &str) -> Vec<Received> {
    receiver
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.trace_id == trace_id)
        .cloned()
        .collect()
}

/// The same export over OTLP/gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`): a
/// worker binary runs a job submitted through the API with a `traceparent`,
/// and the receiver gets that trace's segment span with the step's client
/// span under it. A job whose worker died (RUNNING, its lease lapsed, in a
/// trace of its own) gets the sweeper's span in its trace, saying it was
/// requeued.
#[sqlx::test(migrator = "MIGRATOR")]
async fn spans_are_exported_over_grpc_the_sweepers_included(pool: PgPool) {
    tokio::time::timeout(Duration::from_secs(120), grpc_export(pool))
        .await
        .expect("the gRPC export timed out");
}

async fn grpc_export(pool: PgPool) {
    const ORPHAN_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const ORPHAN_PARENT: &str = "b7ad6b7169203331";
    let (otlp, receiver) = start_grpc_receiver().await;
    let target = start_target(Arc::default()).await;
    let dir = std::env::temp_dir().join(format!("flotilla-grpc-{}", Uuid::new_v4()));
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(
        dir.join("targets.yaml"),
        format!("targets:\n  t:\n    kind: http\n    base_url: {target}\n"),
    )
    .unwrap();
    let workflow = json!({"name": "grpc_traced", "input_schema": {},
        "steps": [{"name": "only", "target": "t", "method": "m"}]});
    std::fs::write(dir.join("workflows/grpc.json"), workflow.to_string()).unwrap();
    let api = format!("127.0.0.1:{}", flotilla_tests::free_port());
    let mut worker = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
    worker
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env(
            "DATABASE_URL",
            flotilla_tests::database::url_of(&pool).await,
        )
        .env("FLOTILLA_CONSUME_REQUESTS", "false")
        .env("SCHEMA_REGISTRY_URL", "")
        .env("FLOTILLA_WORKER_ID", "grpc-worker")
        .env("FLOTILLA_HTTP_ADDR", &api)
        .env("FLOTILLA_API_TOKENS", "t")
        .env("FLOTILLA_SWEEP_INTERVAL", "100ms")
        .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
        .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"))
        .env("NO_COLOR", "1");
    let mut worker = tokio::task::spawn_blocking(move || {
        let mut worker = Running::start(worker);
        worker.wait_for_line("worker ready", Duration::from_secs(60));
        worker
    })
    .await
    .unwrap();

    let job = Uuid::new_v4();
    flotilla_runtime::tls::http_client()
        .build()
        .unwrap()
        .post(format!("http://{api}/v1/jobs"))
        .bearer_auth("t")
        .header("traceparent", format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01"))
        .json(&json!({"workflow_name": "grpc_traced", "input": {}, "job_id": job}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    // A job whose worker died during its first attempt.
    let orphan = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, workflow_version, definition, input,
             request_digest, status, attempt, max_attempts, event_sequence, traceparent,
             lease_owner, lease_token, lease_until)
         SELECT $2, workflow_name, workflow_version, definition, input, request_digest,
             'RUNNING', 1, max_attempts, 1, $3, 'a-worker-that-died', gen_random_uuid(),
             now() - interval '1 minute'
         FROM workflow_run WHERE job_id = $1",
    )
    .bind(job)
    .bind(orphan)
    .bind(format!("00-{ORPHAN_TRACE}-{ORPHAN_PARENT}-01"))
    .execute(&pool)
    .await
    .unwrap();

    let deadline = Instant::now() + Duration::from_secs(60);
    let (segment, step, sweep) = loop {
        let spans = spans_of(&receiver, TRACE_ID);
        // The API's server span under the caller's, the segment under it.
        let server = spans
            .iter()
            .find(|s| {
                s.name == "POST /v1/jobs" && s.kind == SpanKind::Server && s.parent == PRODUCER_SPAN
            })
            .cloned();
        let segment = server.and_then(|server| {
            spans
                .iter()
                .find(|s| s.name == "run grpc_traced" && s.parent == server.span_id)
                .cloned()
        });
        let step = segment.as_ref().and_then(|segment| {
            spans
                .iter()
                .find(|s| s.kind == SpanKind::Client && s.parent == segment.span_id)
                .cloned()
        });
        let sweep = spans_of(&receiver, ORPHAN_TRACE)
            .into_iter()
            .find(|s| s.name == "sweep grpc_traced");
        if let (Some(segment), Some(step), Some(sweep)) = (segment, step, sweep) {
            break (segment, step, sweep);
        }
        assert!(
            Instant::now() < deadline,
            "spans missing from the gRPC receiver: {:#?}",
            receiver.0.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(segment.service.contains("flotilla-worker"), "{segment:#?}");
    assert_eq!(step.name, "step only", "{step:#?}");
    assert!(
        step.attributes["flotilla.outcome"].contains("ok"),
        "{step:#?}"
    );
    assert!(
        step.attributes["job_id"].contains(&job.to_string()),
        "{step:#?}"
    );
    assert_eq!(
        sweep.parent, ORPHAN_PARENT,
        "the sweep continues the job's trace"
    );
    assert!(
        sweep.attributes["job_id"].contains(&orphan.to_string()),
        "{sweep:#?}"
    );
    assert!(
        sweep.attributes["flotilla.outcome"].contains("requeued"),
        "{sweep:#?}"
    );
    assert!(sweep.attributes["attempt"].contains('1'), "{sweep:#?}");

    let status = tokio::task::spawn_blocking(move || worker.terminate(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `flotilla_step_retries_total` says why a step is retried: a target that
/// does not answer within the step's timeout counts as `timeout`, one that
/// answers 503 as `status`.
#[sqlx::test(migrator = "MIGRATOR")]
async fn step_retries_are_counted_by_failure_class(pool: PgPool) {
    use flotilla_worker::targets::http::{DEFAULT_MAX_RESPONSE_BYTES, HttpTarget};
    use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall};
    use flotilla_worker::test_support::{TEST_TOKEN, TestApp, echo_targets};

    let mut targets = echo_targets();
    // Silent on its first call (past the step's timeout), then answers.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    targets.register(
        "slow",
        Arc::new(FnTarget(move |_: TargetCall| {
            let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            async move {
                if first {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                Ok::<_, StepFailure>(json!({}))
            }
        })),
        8,
    );
    // Answers 503 to the first call of `flaky` that carries a traceparent.
    let url = start_target(Arc::default()).await;
    let http = HttpTarget::new(&url, Duration::from_secs(5), DEFAULT_MAX_RESPONSE_BYTES).unwrap();
    targets.register("http", Arc::new(http), 8);
    let app = TestApp::spawn_with(pool.clone(), &["--backoff-base", "10ms"], targets).await;
    let client = flotilla_runtime::tls::http_client().build().unwrap();
    for (workflow, step) in [
        (
            "timed",
            json!({"name": "s", "target": "slow", "method": "m", "timeout_ms": 100}),
        ),
        (
            "busy",
            json!({"name": "s", "target": "http", "method": "flaky"}),
        ),
    ] {
        let definition = json!({"name": workflow, "input_schema": {}, "steps": [step]});
        client
            .put(format!("{}/v1/workflows/{workflow}", app.url))
            .bearer_auth(TEST_TOKEN)
            .json(&definition)
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
        client
            .post(format!("{}/v1/jobs", app.url))
            .bearer_auth(TEST_TOKEN)
            .header("traceparent", format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01"))
            .json(&json!({"workflow_name": workflow, "input": {}, "job_id": Uuid::new_v4()}))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
    }

    let retries_of = |scrape: &prometheus_parse::Scrape, class: &str| {
        sum_of(
            scrape,
            "flotilla_step_retries_total",
            Some(("class", class)),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (text, scrape) = scrape(&client, &app.url).await;
        let completed: Vec<String> =
            sqlx::query_scalar("SELECT workflow_name FROM workflow_run WHERE status = 'COMPLETED'")
                .fetch_all(&pool)
                .await
                .unwrap();
        if completed.len() == 2 {
            assert_eq!(retries_of(&scrape, "timeout"), 1.0, "{text}");
            assert_eq!(retries_of(&scrape, "status"), 1.0, "{text}");
            assert_eq!(retries_of(&scrape, "retryable"), 0.0, "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "both jobs never completed: {completed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
}

/// A job the sweeper sends DEAD (its worker lost once too often) counts in
/// `flotilla_jobs_dead_total` for its workflow, as any other DEAD job; one
/// of an inline definition counts under `inline`, never under the name its
/// submitter chose (or `/metrics` would grow with every name sent).
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_the_sweeper_sends_dead_counts_as_dead(pool: PgPool) {
    use flotilla_worker::test_support::{TestApp, echo_targets};

    let flags = ["--sweep-interval", "100ms", "--max-lease-losses", "3"];
    let app = TestApp::spawn_with(pool.clone(), &flags, echo_targets()).await;
    let stored = format!("swept_{}", Uuid::new_v4().simple());
    let inline = format!("inline_{}", Uuid::new_v4().simple());
    sqlx::query("INSERT INTO workflow_definition (name, version, definition) VALUES ($1, 1, '{}')")
        .bind(&stored)
        .execute(&pool)
        .await
        .unwrap();
    // Their worker died for the third time in a row.
    let mut jobs = Vec::new();
    for (workflow, version) in [(&stored, Some(1)), (&inline, None)] {
        let job = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO workflow_run (job_id, workflow_name, workflow_version, definition, input,
                 request_digest, status, attempt, max_attempts, event_sequence, lease_owner,
                 lease_token, lease_until, lease_losses)
             VALUES ($1, $2, $3, '{}', '{}', 'digest', 'RUNNING', 1, 3, 1, 'a-worker-that-died',
                 gen_random_uuid(), now() - interval '1 minute', 2)",
        )
        .bind(job)
        .bind(workflow)
        .bind(version)
        .execute(&pool)
        .await
        .unwrap();
        jobs.push(job);
    }
    // The worker's sweeper settles them, and counts them.
    let client = flotilla_runtime::tls::http_client().build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (text, scrape) = scrape(&client, &app.url).await;
        let dead = sum_of(
            &scrape,
            "flotilla_jobs_dead_total",
            Some(("workflow", &stored)),
        );
        let dead_inline = sum_of(
            &scrape,
            "flotilla_jobs_dead_total",
            Some(("workflow", "inline")),
        );
        if dead > 0.0 && dead_inline > 0.0 {
            assert_eq!((dead, dead_inline), (1.0, 1.0), "{text}");
            assert!(
                !text.contains(&inline),
                "an inline name became a label: {text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "never counted DEAD: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for job in jobs {
        let status: String =
            sqlx::query_scalar("SELECT status FROM workflow_run WHERE job_id = $1")
                .bind(job)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(status, "DEAD");
    }
    app.stop().await;
}

/// A job asleep on a timer shows in `flotilla_timers_pending` (read from
/// the database at the scrape), none overdue; a `for_each` item answered
/// counts in `flotilla_items_done_total`.
#[sqlx::test(migrator = "MIGRATOR")]
async fn sleeping_jobs_and_answered_items_show_in_the_metrics(pool: PgPool) {
    use flotilla_worker::test_support::{TEST_TOKEN, TestApp};

    let app = TestApp::spawn(pool.clone()).await;
    let client = flotilla_runtime::tls::http_client().build().unwrap();
    let definition = json!({"name": "napper", "input_schema": {},
    "steps": [
        {"name": "each", "target": "echo", "method": "m", "for_each": "[1, 2]"},
        {"name": "nap", "sleep": "1h"}
    ]});
    client
        .put(format!("{}/v1/workflows/napper", app.url))
        .bearer_auth(TEST_TOKEN)
        .json(&definition)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let (_, before) = scrape(&client, &app.url).await;
    let items_before = sum_of(&before, "flotilla_items_done_total", None);
    client
        .post(format!("{}/v1/jobs", app.url))
        .bearer_auth(TEST_TOKEN)
        .json(&json!({"workflow_name": "napper", "input": {}}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let asleep = scrape_until(&client, &app.url, "the job never went to sleep", |scrape| {
        sum_of(scrape, "flotilla_timers_pending", None) >= 1.0
    })
    .await;
    assert_eq!(sum_of(&asleep, "flotilla_timers_pending", None), 1.0);
    assert_eq!(
        sum_of(&asleep, "flotilla_timer_oldest_overdue_seconds", None),
        0.0
    );
    assert!(
        sum_of(&asleep, "flotilla_items_done_total", None) >= items_before + 2.0,
        "both items counted"
    );
    app.stop().await;
}
