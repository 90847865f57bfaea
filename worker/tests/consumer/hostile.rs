//! Requests that decode but that the store cannot hold: each is dead-lettered
//! on its own and every other request of its partition becomes a row.

use super::*;

/// JSON request text with `name` spliced in raw (so it may carry escapes).
fn raw_request(job_id: Uuid, workflow_name: &str, input: &str) -> Vec<u8> {
    format!(r#"{{"job_id": "{job_id}", "workflow_name": {workflow_name}, "input": {input}}}"#)
        .into_bytes()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_nul_request_between_good_ones_on_every_partition_is_dead_lettered_and_the_rest_become_rows(
    pool: PgPool,
) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let (stop_a, first) = spawn(support::consumer(&engine, &topics));
        let (stop_b, second) = spawn(support::consumer(&engine, &topics));
        let producer = producer();
        let mut good = Vec::new();
        for partition in 0..support::PARTITIONS {
            let bad = [
                raw_request(Uuid::new_v4(), r#""greet""#, r#"{"name": "a\u0000b"}"#),
                raw_request(Uuid::new_v4(), r#""gr\u0000eet""#, r#"{"name": "x"}"#),
                raw_request(
                    Uuid::new_v4(),
                    &format!("\"{}\"", "w".repeat(3000)),
                    r#"{"name": "x"}"#,
                ),
                raw_request(Uuid::nil(), r#""greet""#, r#"{"name": "x"}"#),
            ];
            for payload in bad {
                let job_id = Uuid::new_v4();
                good.push(job_id);
                let ok = raw_request(job_id, r#""greet""#, r#"{"name": "fine"}"#);
                support::produce_to(&producer, &topics.requests, partition, &ok, None).await;
                support::produce_to(&producer, &topics.requests, partition, &payload, None).await;
            }
            // A traceparent with a NUL is dropped; its request is still a row.
            let job_id = Uuid::new_v4();
            good.push(job_id);
            let traced = raw_request(job_id, r#""greet""#, r#"{"name": "traced"}"#);
            let header = support::traceparent_header("00-\u{0}-bad");
            support::produce_to(
                &producer,
                &topics.requests,
                partition,
                &traced,
                Some(header),
            )
            .await;
        }
        let expected_rows = i64::try_from(good.len()).unwrap();
        wait_rows(&pool, expected_rows).await;
        let letters = support::dead_letters(&topics.dead_letters, 12).await;
        let codes: Vec<&str> = letters.iter().map(|l| l.headers[CODE].as_str()).collect();
        assert_eq!(
            codes.iter().filter(|c| **c == "unstorable").count(),
            9,
            "{codes:?}"
        );
        assert_eq!(
            codes.iter().filter(|c| **c == "rule_broken").count(),
            3,
            "{codes:?}"
        );
        assert!(
            letters
                .iter()
                .filter(|l| l.headers[CODE] == "unstorable")
                .all(|l| l.headers[REASON].contains("NUL")
                    || l.headers[REASON].contains("over the limit"))
        );
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        assert_eq!(
            count(&pool, "SELECT count(*) FROM workflow_run").await,
            expected_rows
        );
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM workflow_run WHERE traceparent IS NOT NULL"
            )
            .await,
            0,
            "no malformed traceparent was stored"
        );
        stop_a.cancel();
        stop_b.cancel();
        first.await.unwrap();
        second.await.unwrap();
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_registry_answering_500_then_200_pauses_and_both_requests_become_rows(pool: PgPool) {
    use flotilla_contracts::{Message as _, WorkflowRunRequest};
    use flotilla_tests::registry_stub::{RegistryStub, schema_answer};
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let stub = RegistryStub::start(vec![
            (
                500,
                r#"{"error_code": 50001, "message": "boom"}"#.to_owned(),
            ),
            schema_answer(WorkflowRunRequest::schema_text()),
        ])
        .await;
        let codec = std::sync::Arc::new(flotilla_codec::Codec::with_registry(&stub.url()).unwrap());
        let (stop, handle) = spawn(support::consumer_with_codec(&engine, &topics, codec));
        let producer = producer();
        for name in ["first", "second"] {
            produce_request(
                &producer,
                &topics.requests,
                Uuid::new_v4(),
                json!({"name": name}),
                true,
            )
            .await;
        }
        wait_rows(&pool, 2).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        assert!(
            stub.requests() >= 2,
            "the 500 was met and the id asked again"
        );
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM workflow_run WHERE status = 'QUEUED'"
            )
            .await,
            2
        );
        stop.cancel();
        handle.await.unwrap();
        let letters = support::dead_letter_count(&topics.dead_letters);
        assert_eq!(letters, 0, "nothing was dead-lettered");
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn batches_are_bounded_by_bytes_and_an_oversize_value_is_never_copied(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        let mut settings = flotilla_worker::ingest::ConsumerSettings::new(
            flotilla_tests::broker(),
            &topics.requests,
            &topics.group,
        );
        settings.max_request_bytes = 8 * 1024;
        settings.batch_bytes = 12 * 1024;
        settings.batch_wait = Duration::from_secs(5);
        let consumer =
            flotilla_worker::ingest::RequestConsumer::subscribe(engine, support::codec(), settings)
                .unwrap();
        let producer = producer();
        let big = vec![b'x'; 100 * 1024];
        support::produce_to(&producer, &topics.requests, 0, &big, None).await;
        for _ in 0..6 {
            support::produce_to(&producer, &topics.requests, 0, &[b'y'; 5 * 1024], None).await;
        }
        let never = CancellationToken::new();
        let first = consumer.next_batch(&never).await.unwrap();
        assert_eq!(first[0].dropped_value_bytes(), Some(100 * 1024));
        assert!(
            rdkafka::Message::payload(&*first[0]).is_none(),
            "the oversize value was left behind"
        );
        // A batch closes once it holds 12 KiB: at most three 5 KiB values.
        let held = |batch: &[flotilla_worker::ingest::Received]| {
            batch
                .iter()
                .filter(|m| rdkafka::Message::payload(&***m).is_some())
                .count()
        };
        let mut held_per_batch = vec![held(&first)];
        let mut taken = first.len();
        while taken < 7 {
            let batch = consumer.next_batch(&never).await.unwrap();
            taken += batch.len();
            held_per_batch.push(held(&batch));
        }
        assert!(
            held_per_batch.iter().all(|n| *n <= 3),
            "values per batch: {held_per_batch:?}"
        );
        assert!(
            held_per_batch.len() >= 2,
            "the bytes bound closed a batch: {held_per_batch:?}"
        );
        consumer.close();
    })
    .await;
}
