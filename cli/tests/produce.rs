//! `flotilla produce` puts a decodable request on the topic, Avro or JSON,
//! and refuses bad input with exit code 2.

use std::process::Command;
use std::time::Duration;

use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunRequest, framing};
use flotilla_tests::process::Running;
use flotilla_tests::{
    KAFKA_TEST_TIMEOUT, bootstrap_servers, close_consumer, create_topic,
    manual_commit_consumer_config, schema_registry_url, unique,
};
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};

fn produce(topic: &str, extra: &[&str]) -> (std::process::ExitStatus, Vec<String>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command
        .args(["produce", "--workflow", "greet", "--topic", topic])
        .args(extra)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
        .env("SCHEMA_REGISTRY_URL", schema_registry_url());
    let mut running = Running::start(command);
    let status = running.wait(Duration::from_secs(60));
    (status, std::mem::take(&mut running.output))
}

#[tokio::test]
async fn produce_writes_avro_and_json_requests_that_decode() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("cli-requests");
        create_topic(&topic, 1).await.unwrap();
        let job = "5b0c6f2e-8a39-4d1e-9c39-6a7c0f1d2e3f";
        let (status, output) = tokio::task::spawn_blocking({
            let topic = topic.clone();
            move || produce(&topic, &["--input", r#"{"name":"ada"}"#, "--job-id", job])
        })
        .await
        .unwrap();
        assert!(status.success(), "{output:?}");
        assert!(
            output.iter().any(|l| l == job),
            "prints the job id: {output:?}"
        );
        let (status, output) = tokio::task::spawn_blocking({
            let topic = topic.clone();
            move || {
                produce(
                    &topic,
                    &[
                        "--json",
                        "--traceparent",
                        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                    ],
                )
            }
        })
        .await
        .unwrap();
        assert!(status.success(), "{output:?}");

        let consumer: StreamConsumer = manual_commit_consumer_config(&unique("cli-reader"))
            .create()
            .unwrap();
        consumer.subscribe(&[&topic]).unwrap();
        let codec = Codec::with_registry(&schema_registry_url()).unwrap();
        let mut decoded = Vec::new();
        for _ in 0..2 {
            let message = consumer.recv().await.unwrap();
            let payload = message.payload().unwrap().to_vec();
            let is_avro = matches!(framing::detect(&payload), Ok(framing::Framed::Avro { .. }));
            let has_trace = message.headers().is_some();
            let request: WorkflowRunRequest = codec.decode(&payload).await.unwrap();
            assert_eq!(message.key(), Some(request.job_id().to_string().as_bytes()));
            decoded.push((is_avro, has_trace, request));
        }
        close_consumer(consumer);
        assert!(
            decoded[0].0 && !decoded[0].1,
            "the first is Avro, without a trace header"
        );
        assert_eq!(decoded[0].2.job_id().to_string(), job);
        assert_eq!(decoded[0].2.input(), &serde_json::json!({"name": "ada"}));
        assert!(
            !decoded[1].0 && decoded[1].1,
            "--json writes JSON; --traceparent adds the header"
        );
    })
    .await
    .expect("the CLI test timed out");
}

#[test]
fn produce_refuses_input_that_is_not_json_with_exit_code_2() {
    let (status, output) = produce("unused", &["--input", "{nope"]);
    assert_eq!(status.code(), Some(2), "{output:?}");
    assert!(
        output.iter().any(|l| l.contains("--input is not JSON")),
        "{output:?}"
    );
}
