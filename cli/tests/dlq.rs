//! `flotilla dlq` against a worker consuming its own request topic: a
//! request it refused is listed with its reason, shown whole, and replayed
//! under its job id to become a COMPLETED job; replaying it again is the
//! same job; a letter that is not there, or not named right, is said so.

use std::process::Command;
use std::time::Duration;

use flotilla_tests::process::Running;
use flotilla_tests::{KAFKA_TEST_TIMEOUT, bootstrap_servers, create_topic, unique};
use flotilla_worker::test_support::{TestApp, echo_targets};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};
use sqlx::PgPool;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// Runs `flotilla dlq ARGS` on `topic`: (exit code, stdout and stderr lines).
async fn dlq(topic: &str, args: &[&str]) -> (Option<i32>, Vec<String>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command
        .arg("dlq")
        .args(args)
        .args(["--topic", topic])
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
        .env_remove("SCHEMA_REGISTRY_URL");
    tokio::task::spawn_blocking(move || {
        let mut running = Running::start(command);
        let status = running.wait(Duration::from_secs(60));
        (status.code(), std::mem::take(&mut running.output))
    })
    .await
    .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_refused_request_is_listed_shown_and_replayed_corrected_under_its_job_id(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("cli-dlq-requests");
        create_topic(&topic, 1).await.unwrap();
        create_topic(&format!("{topic}.dlq"), 1).await.unwrap();
        let group = unique("cli-dlq-workers");
        let flags = [
            "--consume-requests",
            "true",
            "--request-topic",
            &topic,
            "--signal-topic",
            "",
            "--consumer-group",
            &group,
            "--bootstrap-servers",
            &bootstrap_servers(),
        ];
        let app = TestApp::spawn_with(pool.clone(), &flags, echo_targets()).await;
        let greet = json!({"name": "greet", "input_schema": {},
            "steps": [{"name": "hello", "target": "echo", "method": "hello"}]});
        app.engine.register_workflow(&greet).await.unwrap();

        // A request with a field the contract does not have: refused whole.
        let job_id = uuid::Uuid::new_v4();
        let refused = json!({"job_id": job_id, "workflow_name": "greet",
            "input": {"name": "Ada"}, "colour": "red"});
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers())
            .create()
            .unwrap();
        let key = job_id.to_string();
        let value = refused.to_string();
        producer
            .send(
                FutureRecord::to(&topic).key(&key).payload(&value),
                Duration::from_secs(30),
            )
            .await
            .unwrap();

        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let listed: Value = loop {
            let (code, out) = dlq(&topic, &["list", "--json"]).await;
            assert_eq!(code, Some(0), "{out:?}");
            if let Some(line) = out.iter().find(|l| l.starts_with('{')) {
                break serde_json::from_str(line).unwrap();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "nothing dead-lettered: {out:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(listed["letter"], "0:0", "{listed}");
        assert_eq!(listed["key"], key.as_str(), "{listed}");
        assert!(
            listed["reason"].as_str().unwrap().contains("colour"),
            "{listed}"
        );
        assert_eq!(listed["source"], format!("{topic}/0:0"), "{listed}");

        let (code, out) = dlq(&topic, &["show", "0:0"]).await;
        assert_eq!(code, Some(0), "{out:?}");
        // The pretty document, from its opening line to its closing one.
        let document: Vec<&str> = out
            .iter()
            .map(String::as_str)
            .skip_while(|l| *l != "{")
            .take_while(|l| *l != "}")
            .chain(["}"])
            .collect();
        let shown: Value = serde_json::from_str(&document.join("\n")).unwrap();
        assert_eq!(shown["value"], refused, "{shown}");
        assert_eq!(
            shown["headers"]["flotilla.dlq.code"], listed["code"],
            "{shown}"
        );

        // Replayed as it can be read (the unknown field left behind), twice.
        for _ in 0..2 {
            let (code, out) = dlq(&topic, &["replay", "0:0"]).await;
            assert_eq!(code, Some(0), "{out:?}");
            // stdout and stderr interleave: the job id is a line of its own.
            assert!(out.contains(&key), "{out:?}");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let row = app.engine.job(job_id).await.unwrap();
            if row
                .as_ref()
                .is_some_and(|r| r.status.as_str() == "COMPLETED")
            {
                assert_eq!(row.unwrap().input.0, json!({"name": "Ada"}));
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the replayed job did not complete: {row:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let (code, out) = dlq(&topic, &["show", "zero"]).await;
        assert_eq!(code, Some(2), "{out:?}");
        let (code, out) = dlq(&topic, &["show", "0:99"]).await;
        assert_eq!(code, Some(3), "{out:?}");
        let (code, out) = dlq(&topic, &["replay", "0:0", "--input", "{not json"]).await;
        assert_eq!(code, Some(2), "{out:?}");
        app.stop().await;
    })
    .await
    .expect("the test timed out");
}
