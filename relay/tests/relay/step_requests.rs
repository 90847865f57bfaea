//! The request outbox of Kafka-target steps: a request written by a park
//! whose worker is gone (killed after its commit) is sent by the relay that
//! holds the job's bucket, keyed by job id with the step's headers, and
//! deleted once acknowledged; a row that does not decode is set aside with
//! its reason and never sent.

use flotilla_contracts::{StepRequestParts, WorkflowStepRequest};

use super::*;

async fn insert_request(
    pool: &PgPool,
    job_id: Uuid,
    topic: &str,
    payload: serde_json::Value,
) -> Uuid {
    let correlation_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workflow_step_request_outbox
             (job_id, step_name, correlation_id, topic, encoding, payload, traceparent)
         VALUES ($1, 'score', $2, $3, 'json', $4, $5)",
    )
    .bind(job_id)
    .bind(correlation_id)
    .bind(topic)
    .bind(sqlx::types::Json(payload))
    .bind(format!("00-{}-00f067aa0ba902b7-01", job_id.simple()))
    .execute(pool)
    .await
    .unwrap();
    correlation_id
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_request_left_by_a_killed_worker_is_sent_once_the_relay_runs(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let (events, requests) = (unique("sr-events"), unique("sr-requests"));
        create_topic(&events, 1).await.unwrap();
        create_topic(&requests, 1).await.unwrap();
        let job_id = Uuid::new_v4();
        let request = WorkflowStepRequest::new(StepRequestParts {
            job_id,
            step_name: "score".into(),
            attempt: 1,
            correlation_id: Uuid::new_v4(),
            reply_topic: "sr-replies".into(),
            request: json!({"amount": 7}),
            deadline: Utc::now() + chrono::TimeDelta::minutes(1),
        })
        .unwrap();
        let correlation = insert_request(
            &pool,
            job_id,
            &requests,
            serde_json::to_value(&request).unwrap(),
        )
        .await;
        // A row a newer or broken writer left: set aside, the rest go on.
        let broken = Uuid::new_v4();
        insert_request(&pool, broken, &requests, json!({"not": "a request"})).await;

        let relay = Relay::new(
            pool.clone(),
            Arc::new(SystemClock),
            settings(&bootstrap_servers(), &events, "sender"),
        )
        .unwrap();
        relay.publish_once().await.unwrap(); // takes its buckets
        let pass = relay.send_step_requests().await.unwrap();
        assert_eq!(
            (pass.sent, pass.unreadable, pass.deferred),
            (1, 1, 0),
            "{pass:?}"
        );

        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers())
            .set("group.id", unique("sr-reader"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        consumer.subscribe(&[requests.as_str()]).unwrap();
        let message = consumer.recv().await.unwrap();
        let sent: WorkflowStepRequest =
            flotilla_contracts::json::decode(message.payload().unwrap()).unwrap();
        assert_eq!(sent, request);
        assert_eq!(message.key(), Some(job_id.to_string().as_bytes()));
        let header = |name: &str| {
            message.headers().and_then(|headers| {
                headers
                    .iter()
                    .find(|h| h.key == name)
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            })
        };
        assert_eq!(
            header("flotilla.correlation-id"),
            Some(correlation.to_string())
        );
        assert_eq!(header("flotilla.step").as_deref(), Some("score"));
        assert_eq!(header("idempotency-key"), Some(format!("{job_id}:score")));
        assert!(header("traceparent").is_some_and(|t| t.contains(&job_id.simple().to_string())));
        close_consumer(consumer);

        let left: Vec<(Uuid, Option<String>)> =
            sqlx::query_as("SELECT job_id, last_error FROM workflow_step_request_outbox")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(left.len(), 1, "the sent row is deleted: {left:?}");
        assert_eq!(left[0].0, broken);
        assert!(
            left[0]
                .1
                .as_deref()
                .is_some_and(|e| e.contains("does not decode")),
            "{left:?}"
        );
        let again = relay.send_step_requests().await.unwrap();
        assert_eq!(
            again.sent + again.unreadable,
            0,
            "the set-aside row is not read again"
        );
    })
    .await
    .expect("the test timed out");
}
