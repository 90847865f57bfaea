//! A fleet for the client's tests: a worker and a relay (the binaries) on
//! topics of their own, Avro through the registry, running `shipping`, two
//! HTTP steps against an in-test echo service.

use std::process::Command;
use std::time::Duration;

#[cfg(feature = "kafka")]
use flotilla_client::{
    BrokerConfig, Delivery, EventStream, EventStreamOptions, StreamError, WorkflowRunEvent,
    WorkflowRunEventType,
};
use flotilla_tests::process::{Running, workspace_binary};
use flotilla_tests::{bootstrap_servers, create_topic, schema_registry_url, unique};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

pub(crate) const TOKEN: &str = "client-test-token";
pub(crate) const WORKFLOW: &str = "shipping";

/// The broker and registry as a user of the client describes them.
#[cfg(feature = "kafka")]
pub(crate) fn broker() -> BrokerConfig {
    let mut broker = BrokerConfig::new(&bootstrap_servers());
    broker.registry = flotilla_runtime::registry::RegistryConfig::new(&schema_registry_url());
    broker
}

async fn echo_service() -> String {
    use axum::routing::post;
    let echo = |axum::Json(body): axum::Json<serde_json::Value>| async move {
        axum::Json(json!({ "echo": body }))
    };
    let app = axum::Router::new()
        .route("/pack", post(echo))
        .route("/ship", post(echo));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

pub(crate) struct Fleet {
    worker: Running,
    relay: Running,
    dir: std::path::PathBuf,
    pub(crate) request_topic: String,
    pub(crate) event_topic: String,
    pub(crate) api_url: String,
    pub(crate) database_url: String,
}

impl Fleet {
    pub(crate) async fn start(pool: &PgPool) -> Self {
        let service = echo_service().await;
        let (request_topic, event_topic) = (unique("client-requests"), unique("client-events"));
        create_topic(&request_topic, 3).await.unwrap();
        create_topic(&event_topic, 3).await.unwrap();
        let dir = std::env::temp_dir().join(format!("flotilla-client-{}", Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("workflows")).unwrap();
        std::fs::write(
            dir.join("targets.yaml"),
            format!("targets:\n  svc:\n    kind: http\n    base_url: {service}\n"),
        )
        .unwrap();
        let definition = json!({
            "name": WORKFLOW, "input_schema": {},
            "steps": [
                {"name": "pack", "target": "svc", "method": "pack"},
                {"name": "ship", "target": "svc", "method": "ship"}
            ]
        });
        std::fs::write(dir.join("workflows/shipping.json"), definition.to_string()).unwrap();
        // For the waits' other ends: a final 404, an input refused, a job
        // parked until a signal nobody sends.
        let others = [
            json!({"name": "breaking", "input_schema": {},
                   "steps": [{"name": "lost", "target": "svc", "method": "nowhere"}]}),
            json!({"name": "strict", "input_schema": {"type": "object", "required": ["order"]},
                   "steps": [{"name": "pack", "target": "svc", "method": "pack"}]}),
            json!({"name": "parked", "input_schema": {},
                   "steps": [{"name": "hold", "wait_for": "go"}]}),
            json!({"name": "approval", "input_schema": {},
                   "steps": [{"name": "approve", "target": "svc", "method": "pack", "completion": "external"}]}),
        ];
        for definition in others {
            let file = format!("workflows/{}.json", definition["name"].as_str().unwrap());
            std::fs::write(dir.join(file), definition.to_string()).unwrap();
        }
        let database_url = flotilla_tests::database::url_of(pool).await;
        let port = flotilla_tests::free_port();
        let mut worker = Command::new(workspace_binary("flotilla-worker"));
        worker
            .env("DATABASE_URL", &database_url)
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
            .env("SCHEMA_REGISTRY_URL", schema_registry_url())
            .env("FLOTILLA_WORKER_ID", unique("client-worker"))
            .env("FLOTILLA_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("FLOTILLA_API_TOKENS", TOKEN)
            .env("FLOTILLA_REQUEST_TOPIC", &request_topic)
            .env("FLOTILLA_CONSUMER_GROUP", unique("client-workers"))
            .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
            .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"))
            .env("NO_COLOR", "1");
        let mut relay = Command::new(workspace_binary("flotilla-relay"));
        relay
            .env("DATABASE_URL", &database_url)
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
            .env("SCHEMA_REGISTRY_URL", schema_registry_url())
            .env("FLOTILLA_EVENT_TOPIC", &event_topic)
            .env("FLOTILLA_RELAY_ID", unique("client-relay"))
            .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0")
            .env("NO_COLOR", "1");
        let (worker, relay) = tokio::task::spawn_blocking(move || {
            let mut worker = Running::start(worker);
            worker.wait_for_line("worker ready", Duration::from_secs(60));
            let mut relay = Running::start(relay);
            relay.wait_for_line("relay ready", Duration::from_secs(60));
            (worker, relay)
        })
        .await
        .unwrap();
        Self {
            worker,
            relay,
            dir,
            request_topic,
            event_topic,
            api_url: format!("http://127.0.0.1:{port}"),
            database_url,
        }
    }

    /// An event stream on the fleet's event topic, in a group of its own.
    #[cfg(feature = "kafka")]
    pub(crate) fn events(&self) -> EventStream {
        let options = EventStreamOptions::new(&unique("client-stream")).topic(&self.event_topic);
        EventStream::subscribe(&broker(), &options).unwrap()
    }

    pub(crate) async fn stop(self) {
        let Self {
            mut worker,
            mut relay,
            dir,
            ..
        } = self;
        tokio::task::spawn_blocking(move || {
            assert!(relay.terminate(Duration::from_secs(30)).success());
            assert!(worker.terminate(Duration::from_secs(30)).success());
        })
        .await
        .unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// Reads until every job in `jobs` has published COMPLETED, acknowledging
/// each event; returns each job's events in the order they came.
#[cfg(feature = "kafka")]
pub(crate) async fn until_completed(
    stream: &mut EventStream,
    jobs: &[Uuid],
) -> std::collections::HashMap<Uuid, Vec<WorkflowRunEvent>> {
    let mut seen: std::collections::HashMap<Uuid, Vec<WorkflowRunEvent>> =
        jobs.iter().map(|job| (*job, Vec::new())).collect();
    let done = |seen: &std::collections::HashMap<Uuid, Vec<WorkflowRunEvent>>| {
        seen.values().all(|events| {
            events
                .last()
                .is_some_and(|e| e.event_type() == WorkflowRunEventType::Completed)
        })
    };
    while !done(&seen) {
        let delivery: Delivery = match stream.next().await {
            Ok(delivery) => delivery,
            Err(StreamError::Unavailable(e)) => {
                // The topic's metadata may lag its creation a moment.
                eprintln!("stream unavailable: {e}");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        if let Some(events) = seen.get_mut(&delivery.event().job_id()) {
            events.push(delivery.event().clone());
        }
        stream.ack(&delivery);
    }
    seen
}
