//! What cannot become a queued row: dead letters and FAILED rows.

use super::*;

#[sqlx::test(migrator = "MIGRATOR")]
async fn poison_messages_are_dead_lettered_with_reasons_and_the_partitions_move_on(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        let good = |n: usize| json!({"name": format!("good{n}")});
        let request_avro = support::codec()
            .encode(&topics.requests, &flotilla_contracts::WorkflowRunRequest::new(Uuid::new_v4(), "greet", good(99)).unwrap())
            .await
            .unwrap();
        let poison: Vec<(&str, Vec<u8>)> = vec![
            ("unknown_magic_byte", b"\x07 garbage bytes".to_vec()),
            // Cut inside the input: a datum that stops within a string.
            // (Cut only through its trailing optional fields, apache-avro
            // reads them as their null defaults: see the session note.)
            ("avro_mismatch", request_avro[..request_avro.len() / 2].to_vec()),
            ("unknown_schema_id", framing::frame(999_999_999, b"\x02")),
            ("json_mismatch", br#"{"job_id":"not-a-uuid","workflow_name":"greet","input":{}}"#.to_vec()),
            ("json_mismatch", br#"{"workflow_name":"greet","input":{}}"#.to_vec()),
            ("oversize", {
                let mut big = br#"{"job_id":"6f1c1c9e-0d7a-4d53-9a55-1f8f6b1c2d3e","workflow_name":"greet","input":{"name":""#.to_vec();
                big.extend(std::iter::repeat_n(b'x', support::MAX_REQUEST_BYTES + 10));
                big.extend_from_slice(br#""}}"#);
                big
            }),
            ("empty", Vec::new()),
        ];
        let mut good_ids = Vec::new();
        for (n, (_, bytes)) in poison.iter().enumerate() {
            let job_id = Uuid::new_v4();
            produce_request(&producer, &topics.requests, job_id, good(n), n % 2 == 0).await;
            good_ids.push(job_id);
            let headers = support::traceparent_header("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
            produce_raw(&producer, &topics.requests, &format!("poison-{n}"), bytes, Some(headers)).await;
        }
        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        let letters = support::dead_letters(&topics.dead_letters, poison.len()).await;
        wait_rows(&pool, good_ids.len() as i64).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        handle.await.unwrap();

        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run WHERE status = 'QUEUED'").await, good_ids.len() as i64);
        let mut by_key: Vec<(String, String)> = letters
            .iter()
            .map(|l| (String::from_utf8(l.key.clone().unwrap()).unwrap(), l.headers[CODE].clone()))
            .collect();
        by_key.sort();
        let expected: Vec<(String, String)> = poison.iter().enumerate().map(|(n, (code, _))| (format!("poison-{n}"), (*code).to_owned())).collect();
        assert_eq!(by_key, expected);
        for letter in &letters {
            let n: usize = String::from_utf8(letter.key.clone().unwrap()).unwrap()["poison-".len()..].parse().unwrap();
            if letter.headers[CODE] == "oversize" {
                // Never copied off the client: the size says what it was.
                assert!(letter.payload.is_empty(), "an oversize value is left behind");
                assert_eq!(letter.headers[VALUE_DROPPED], poison[n].1.len().to_string());
            } else {
                assert_eq!(letter.payload, poison[n].1, "the original value is kept");
            }
            assert_eq!(letter.headers[SOURCE_TOPIC], topics.requests);
            assert!(letter.headers[SOURCE_PARTITION].parse::<i32>().is_ok());
            assert!(letter.headers[SOURCE_OFFSET].parse::<i64>().is_ok());
            assert!(!letter.headers[REASON].is_empty());
            assert!(letter.headers.contains_key("traceparent"), "original headers are kept");
        }
        let reason_of = |code: &str| letters.iter().find(|l| l.headers[CODE] == code).unwrap().headers[REASON].clone();
        assert!(reason_of("unknown_schema_id").contains("999999999"));
        assert!(reason_of("oversize").contains(&format!("over the limit of {} bytes", support::MAX_REQUEST_BYTES)));
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn unknown_workflows_and_bad_inputs_become_failed_rows_with_events(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        let (unknown, bad_input, conflicting) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let ghost =
            flotilla_contracts::WorkflowRunRequest::new(unknown, "ghost", json!({})).unwrap();
        produce_raw(
            &producer,
            &topics.requests,
            "a",
            &flotilla_contracts::json::encode(&ghost).unwrap(),
            None,
        )
        .await;
        produce_request(
            &producer,
            &topics.requests,
            bad_input,
            json!({"name": 42}),
            true,
        )
        .await;
        produce_request(
            &producer,
            &topics.requests,
            conflicting,
            json!({"name": "first"}),
            false,
        )
        .await;
        produce_request(
            &producer,
            &topics.requests,
            conflicting,
            json!({"name": "second"}),
            false,
        )
        .await;

        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        let letters = support::dead_letters(&topics.dead_letters, 1).await;
        wait_rows(&pool, 3).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        handle.await.unwrap();

        for (job_id, needle) in [
            (unknown, "unknown workflow \"ghost\""),
            (bad_input, "/name: 42 is not of type \"string\""),
        ] {
            let (status, error): (String, String) =
                sqlx::query_as("SELECT status, error FROM workflow_run WHERE job_id = $1")
                    .bind(job_id)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(status, "FAILED");
            assert!(error.contains(needle), "{error}");
            let events: Vec<String> =
                sqlx::query_scalar("SELECT event_type FROM workflow_run_outbox WHERE job_id = $1")
                    .bind(job_id)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            assert_eq!(events, ["FAILED"]);
        }
        let input: serde_json::Value =
            sqlx::query_scalar("SELECT input FROM workflow_run WHERE job_id = $1")
                .bind(conflicting)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(input, json!({"name": "first"}), "the original stays");
        assert_eq!(letters[0].headers[CODE], "conflict");
        assert!(letters[0].headers[REASON].contains(&conflicting.to_string()));
    })
    .await;
}

/// One message framed with the id of a Protobuf schema registered in the
/// same registry, among good requests on its partition: the registry's
/// definite answer about the id dead-letters that message (its own code),
/// and every other request of the partition becomes a row, its offsets
/// committed. It used to pause the partition for good as a registry outage.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_message_framed_with_a_protobuf_schema_id_is_dead_lettered_and_its_partition_moves_on(
    pool: PgPool,
) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let registry = flotilla_tests::service_env("SCHEMA_REGISTRY_URL");
        let registered: serde_json::Value = flotilla_runtime::tls::http_client()
            .build()
            .unwrap()
            .post(format!(
                "{registry}/subjects/{}-proto-value/versions",
                topics.requests
            ))
            .header("content-type", "application/vnd.schemaregistry.v1+json")
            .json(&json!({
                "schemaType": "PROTOBUF",
                "schema": "syntax = \"proto3\";\nmessage Other { string a = 1; }\n"
            }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let proto_id = u32::try_from(registered["id"].as_u64().expect("an id")).unwrap();
        let producer = producer();
        for n in 0..21 {
            let bytes = if n == 10 {
                framing::frame(proto_id, b"\x02a")
            } else {
                let request = flotilla_contracts::WorkflowRunRequest::new(
                    Uuid::new_v4(),
                    "greet",
                    json!({"name": format!("n{n}")}),
                )
                .unwrap();
                flotilla_contracts::json::encode(&request).unwrap()
            };
            support::produce_to(&producer, &topics.requests, 0, &bytes, None).await;
        }
        let (stop, handle) = spawn(support::consumer(&engine, &topics));
        let letters = support::dead_letters(&topics.dead_letters, 1).await;
        wait_rows(&pool, 20).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        handle.await.unwrap();
        assert_eq!(letters[0].headers[CODE], "not_avro_schema");
        assert!(
            letters[0].headers[REASON].contains("Protobuf"),
            "{}",
            letters[0].headers[REASON]
        );
    })
    .await;
}

/// A dead-letter producer that hits a fatal error (here: the broker answers
/// its first record with a sequence error, which an idempotent producer
/// cannot recover from) is replaced, and the batch's dead letter lands
/// through the new one: the partition is not paused for good. On
/// librdkafka's mock cluster, which injects the sequence error.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_dead_letter_producer_in_a_fatal_state_is_replaced(pool: PgPool) {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    within_deadline(async {
        let mock = support::MockTopics::new("fatal-dlq");
        let broker = mock.broker();
        let producer: rdkafka::producer::FutureProducer = broker.client().create().unwrap();
        producer
            .send(
                rdkafka::producer::FutureRecord::<(), [u8]>::to(&mock.requests)
                    .payload(b"\x07 poison"),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        // The next record produced (the dead letter) is refused as out of
        // sequence at the head of the line: fatal for an idempotent producer.
        mock.cluster.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER],
        );
        let engine = support::engine(&pool);
        let consumer = flotilla_worker::ingest::RequestConsumer::subscribe(
            engine,
            support::codec(),
            mock.settings(),
        )
        .unwrap();
        let (stop, handle) = spawn(consumer);
        let reader: BaseConsumer = broker.client().create().unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (_, high) = reader
                .fetch_watermarks(&mock.dead_letters, 0, Duration::from_secs(5))
                .unwrap();
            if high == 1 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the dead letter never landed"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stop.cancel();
        handle.await.unwrap();
        std::thread::spawn(move || drop(reader));
        std::thread::spawn(move || drop(producer));
        drop(mock);
    })
    .await;
}

/// A dead-letter topic that refuses a dead letter as too large, and then
/// refuses it again without its value (its own headers are too large),
/// gets the minimal letter: the reason headers and the value's size,
/// nothing of the original record. The partition moves on.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_dead_letter_too_large_even_without_its_value_falls_back_to_a_minimal_one(pool: PgPool) {
    use rdkafka::Message as _;
    use rdkafka::consumer::{Consumer as _, StreamConsumer};
    use rdkafka::message::{Header, Headers as _, OwnedHeaders};
    within_deadline(async {
        let requests = flotilla_tests::unique("minimal-dlq-requests");
        let dead_letters = flotilla_contracts::topics::dead_letter_topic(&requests);
        let bootstrap = flotilla_tests::bootstrap_servers();
        flotilla_tests::create_topic(&requests, 1).await.unwrap();
        // Room for the reason headers, not for the original's 4 KiB of them.
        flotilla_tests::create_topic_with(
            &bootstrap,
            &dead_letters,
            1,
            &[("max.message.bytes", "1024")],
        )
        .await
        .unwrap();
        let broker = flotilla_tests::broker();
        let producer: rdkafka::producer::FutureProducer = broker.client().create().unwrap();
        let poison = b"\x07 poison".to_vec();
        let headers = OwnedHeaders::new().insert(Header {
            key: "bulky",
            value: Some(&vec![b'h'; 4096]),
        });
        producer
            .send(
                rdkafka::producer::FutureRecord::to(&requests)
                    .key("poison")
                    .payload(&poison)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        let engine = support::engine(&pool);
        let settings = flotilla_worker::ingest::ConsumerSettings::new(
            broker.clone(),
            &requests,
            &flotilla_tests::unique("minimal-dlq-workers"),
        );
        let consumer =
            flotilla_worker::ingest::RequestConsumer::subscribe(engine, support::codec(), settings)
                .unwrap();
        let (stop, handle) = spawn(consumer);
        let reader: StreamConsumer = broker
            .manual_commit_consumer(&flotilla_tests::unique("dlq-reader"))
            .create()
            .unwrap();
        reader.subscribe(&[&dead_letters]).unwrap();
        let letter = tokio::time::timeout(Duration::from_secs(60), reader.recv())
            .await
            .expect("the dead letter never landed")
            .unwrap()
            .detach();
        stop.cancel();
        handle.await.unwrap();
        let headers: std::collections::HashMap<String, String> = letter
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| {
                        let value = h.value.map(|v| String::from_utf8_lossy(v).into_owned());
                        (h.key.to_owned(), value.unwrap_or_default())
                    })
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(headers[CODE], "unknown_magic_byte");
        assert!(!headers[REASON].is_empty());
        assert_eq!(headers[VALUE_DROPPED], poison.len().to_string());
        assert_eq!(headers[SOURCE_TOPIC], requests);
        assert!(
            !headers.contains_key("bulky"),
            "the original headers are left out"
        );
        assert!(
            letter.payload().is_none_or(<[u8]>::is_empty),
            "the value is left out"
        );
        std::thread::spawn(move || drop(reader));
        std::thread::spawn(move || drop(producer));
    })
    .await;
}
