//! The client as a service that only talks HTTP uses it: built without
//! the `kafka` feature (CI runs this file so as well as with the default
//! features), librdkafka is not in its dependencies, and it submits and
//! awaits a typed result, and finds a job by its labels, through a
//! worker's API.

// This file uses the fleet, not the event-stream helpers beside it.
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use flotilla_client::{JobFilter, Jobs, Submission, Submitter, WaitError};
use flotilla_tests::KAFKA_TEST_TIMEOUT;
use secrecy::SecretString;
use sqlx::PgPool;
use support::{Fleet, TOKEN, WORKFLOW};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// The crates `cargo tree` lists for the client with `features`.
fn client_dependencies(features: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--offline",
            "-p",
            "flotilla-client",
            "-e",
            "normal,build",
        ])
        .args(["--prefix", "none", "--format", "{p}"])
        .args(features)
        .output()
        .expect("running cargo tree");
    assert!(
        output.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn without_the_kafka_feature_librdkafka_is_not_built() {
    let linked = |crates: &[String]| crates.iter().any(|c| c.starts_with("rdkafka"));
    let api_only = client_dependencies(&["--no-default-features"]);
    assert!(
        api_only.iter().any(|c| c == "reqwest"),
        "the API-only build still talks HTTP: {api_only:?}"
    );
    assert!(!linked(&api_only), "{api_only:?}");
    assert!(
        linked(&client_dependencies(&[])),
        "the default build produces to Kafka"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_api_only_client_submits_awaits_and_finds_jobs_by_label(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let fleet = Fleet::start(&pool).await;
        let token = || Some(SecretString::from(TOKEN));
        let submitter = Submitter::api(&fleet.api_url, token()).unwrap();
        let jobs = Jobs::new(&fleet.api_url, token()).unwrap();
        let batch = uuid::Uuid::new_v4().to_string();
        let labelled = |workflow: &str| {
            Submission::new(workflow, &serde_json::json!({"n": 1}))
                .unwrap()
                .with_metadata([("batch", batch.as_str())])
        };

        // The last step's answer, typed: the echo service's `{"echo": …}`.
        #[derive(serde::Deserialize)]
        struct Shipped {
            echo: serde_json::Map<String, serde_json::Value>,
        }
        let shipped = labelled(WORKFLOW);
        let result: Shipped = submitter
            .submit_and_wait(&shipped, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(result.echo.is_empty(), "{:?}", result.echo);
        let broken = submitter
            .submit_and_wait::<serde_json::Value>(&labelled("breaking"), Duration::from_secs(60))
            .await;
        assert!(
            matches!(broken, Err(WaitError::Failed { .. })),
            "{broken:?}"
        );

        // Both are found by their label, and only they.
        let filter = JobFilter {
            metadata: BTreeMap::from([("batch".to_owned(), batch.clone())]),
            ..JobFilter::default()
        };
        let page = jobs.list(&filter, 0, None).await.unwrap();
        let mut found: Vec<_> = page.jobs.iter().map(|j| j.status.as_str()).collect();
        found.sort_unstable();
        assert_eq!(found, ["COMPLETED", "FAILED"], "{page:?}");
        let counted = jobs.bulk(&filter, false, true).await.unwrap();
        assert_eq!(counted["matched"], 2, "{counted}");
        fleet.stop().await;
    })
    .await
    .expect("the test timed out");
}
