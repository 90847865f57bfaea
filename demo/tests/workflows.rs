//! The demo's `returns`, `export` and `packing` workflows on a fleet: the
//! worker binary loading `demo/workflows` and the demo's targets (the crm target
//! and its secret pointed at the demo target, served here), each job
//! submitted through the API and awaited to its result.

use std::process::Command;
use std::time::Duration;

use flotilla_client::{SecretString, Submission, Submitter};
use flotilla_tests::process::{Running, workspace_binary};
use flotilla_tests::{KAFKA_TEST_TIMEOUT, bootstrap_servers, schema_registry_url, unique};
use serde_json::{Value, json};
use sqlx::PgPool;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;
const TOKEN: &str = "demo-test-token";

fn repository() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `demo/targets.yaml` with the crm target at `target_url`.
fn targets_file(dir: &std::path::Path, target_url: &str) -> std::path::PathBuf {
    let demo = std::fs::read_to_string(repository().join("demo/targets.yaml")).unwrap();
    let text = demo.replace("http://127.0.0.1:18090", target_url);
    assert_ne!(
        text, demo,
        "demo/targets.yaml no longer names the crm target's URL"
    );
    let path = dir.join("targets.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_demos_http_call_polling_and_per_item_workflows_complete_on_a_fleet(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target_url = format!("http://{}", listener.local_addr().unwrap());
        let settings = flotilla_demo::target::TargetSettings {
            addr: "127.0.0.1:0".parse().unwrap(),
            latency: Duration::ZERO.into(),
            failure_rate: 0.0,
            kafka_requests: None,
            kafka_bootstrap_servers: bootstrap_servers(),
            schema_registry_url: None,
        };
        let router = flotilla_demo::target::router(&settings);
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

        let dir = std::env::temp_dir().join(unique("demo-workflows"));
        std::fs::create_dir_all(&dir).unwrap();
        let port = flotilla_tests::free_port();
        let mut worker = Command::new(workspace_binary("flotilla-worker"));
        worker
            .env(
                "DATABASE_URL",
                flotilla_tests::database::url_of(&pool).await,
            )
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
            .env("SCHEMA_REGISTRY_URL", schema_registry_url())
            .env("FLOTILLA_WORKER_ID", unique("demo-worker"))
            .env("FLOTILLA_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("FLOTILLA_API_TOKENS", TOKEN)
            .env("FLOTILLA_REQUEST_TOPIC", unique("demo-requests"))
            .env("FLOTILLA_CONSUMER_GROUP", unique("demo-workers"))
            .env("FLOTILLA_TARGETS_FILE", targets_file(&dir, &target_url))
            .env(
                "FLOTILLA_WORKFLOWS_DIR",
                repository().join("demo/workflows"),
            )
            // Everything it logs, so a secret in any of it shows.
            .env("RUST_LOG", "debug")
            .env("NO_COLOR", "1");
        let worker = tokio::task::spawn_blocking(move || {
            let mut worker = Running::start(worker);
            worker.wait_for_line("worker ready", Duration::from_secs(60));
            worker
        })
        .await
        .unwrap();
        let api = format!("http://127.0.0.1:{port}");

        // As a service would: the client library, through the API.
        let submitter = Submitter::api(&api, Some(SecretString::from(TOKEN))).unwrap();
        let wait = Duration::from_secs(60);
        let returns = Submission::new("returns", &json!({"order_id": "A-7/1"})).unwrap();
        let returned: Value = submitter.submit_and_wait(&returns, wait).await.unwrap();
        assert_eq!(
            returned,
            json!({"order": "A-7/1", "lines": 2, "marked": "updated"})
        );
        let export = Submission::new("export", &json!({"order_id": "A-7/1"})).unwrap();
        let exported: Value = submitter.submit_and_wait(&export, wait).await.unwrap();
        assert!(
            exported["url"]
                .as_str()
                .is_some_and(|u| u.ends_with(".csv")),
            "{exported}"
        );
        let packing = Submission::new("packing", &json!({"lines": ["ada", "bob", "cy"]})).unwrap();
        let packed: Value = submitter.submit_and_wait(&packing, wait).await.unwrap();
        let labels = packed["labels"].as_array().map(Vec::len);
        assert_eq!(labels, Some(3), "a child per line: {packed}");
        let graph: Value = flotilla_runtime::tls::http_client()
            .build()
            .unwrap()
            .get(format!("{api}/v1/jobs/{}/graph", returns.job_id()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            graph["nodes"][0]["call"], "GET /orders/A-7%2F1?expand=lines",
            "{graph}"
        );

        let logs = tokio::task::spawn_blocking(move || {
            let mut worker = worker;
            assert!(worker.terminate(Duration::from_secs(30)).success());
            std::mem::take(&mut worker.output)
        })
        .await
        .unwrap();
        // The secret went to the target, never to the logs.
        assert!(!logs.is_empty(), "the worker's output was kept");
        let secret = flotilla_demo::resources::API_KEY;
        assert!(
            logs.iter().all(|line| !line.contains(secret)),
            "the worker logged the target's secret"
        );
        std::fs::remove_dir_all(dir).unwrap();
    })
    .await
    .expect("the test timed out");
}
