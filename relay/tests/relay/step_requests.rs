//! The request outbox of Kafka-target steps: a request written by a park
//! whose worker is gone (killed after its commit) is sent by the relay that
//! holds the job's bucket, keyed by job id with the step's headers, and
//! deleted once acknowledged; a row that does not decode, or that the
//! producer or the broker refuse as too large, is set aside with its reason
//! and never sent; a row nobody waits for any more (past its deadline,
//! superseded by a later request, answered, its job ended or gone) is
//! deleted unsent.

use chrono::DateTime;
use flotilla_contracts::{StepRequestParts, WorkflowStepRequest};

use super::*;

async fn insert_request(
    pool: &PgPool,
    job_id: Uuid,
    topic: &str,
    payload: serde_json::Value,
) -> Uuid {
    let correlation_id = payload["correlation_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(Uuid::new_v4);
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

/// The request of step `score` of `job_id`, `amount` its content.
fn score_request(
    job_id: Uuid,
    deadline: DateTime<Utc>,
    amount: serde_json::Value,
) -> WorkflowStepRequest {
    WorkflowStepRequest::new(StepRequestParts {
        job_id,
        step_name: "score".into(),
        attempt: 1,
        correlation_id: Uuid::new_v4(),
        reply_topic: "sr-replies".into(),
        request: json!({"amount": amount}),
        deadline,
    })
    .unwrap()
}

/// The run row of `job_id` in `status`, its step `score` waiting for the
/// request `entry` names (as the park that wrote the request left it).
async fn insert_run(pool: &PgPool, job_id: Uuid, status: &str, entry: serde_json::Value) {
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest, status,
                                   max_attempts, attempt, outstanding_step, step_requests)
         VALUES ($1, 'scoring', '{}', '{}', 'd', $2, 3, 1,
                 CASE WHEN $2 = 'WAITING' THEN 'score' END, jsonb_build_object('score', $3::jsonb))",
    )
    .bind(job_id)
    .bind(status)
    .bind(sqlx::types::Json(entry))
    .execute(pool)
    .await
    .unwrap();
}

/// The step's entry for `request`, as the park writes it.
fn entry_of(request: &WorkflowStepRequest) -> serde_json::Value {
    json!({
        "correlation_id": request.correlation_id(),
        "attempt": 1,
        "topic": "sr-requests",
        "reply_topic": request.reply_topic(),
        "deadline": request.deadline(),
    })
}

/// A relay holding every bucket.
async fn sending_relay(pool: &PgPool, settings: RelaySettings) -> Relay {
    let relay = Relay::new(pool.clone(), Arc::new(SystemClock), settings).unwrap();
    relay.publish_once().await.unwrap(); // takes its buckets
    relay
}

/// The first request on `topic`, decoded, and its record.
async fn first_request_on(topic: &str) -> (WorkflowStepRequest, rdkafka::message::OwnedMessage) {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers())
        .set("group.id", unique("sr-reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let message = consumer.recv().await.unwrap().detach();
    close_consumer(consumer);
    let request = flotilla_contracts::json::decode(message.payload().unwrap()).unwrap();
    (request, message)
}

/// The records `topic` (one partition) holds.
fn records_on(topic: &str) -> i64 {
    let consumer: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers())
        .create()
        .unwrap();
    let (low, high) = consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap();
    high - low
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_request_left_by_a_killed_worker_is_sent_once_the_relay_runs(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let (events, requests) = (unique("sr-events"), unique("sr-requests"));
        create_topic(&events, 1).await.unwrap();
        create_topic(&requests, 1).await.unwrap();
        let job_id = Uuid::new_v4();
        let request = score_request(job_id, Utc::now() + chrono::TimeDelta::minutes(1), json!(7));
        insert_run(&pool, job_id, "WAITING", entry_of(&request)).await;
        let correlation = insert_request(
            &pool,
            job_id,
            &requests,
            serde_json::to_value(&request).unwrap(),
        )
        .await;
        // A row a newer or broken writer left, for a job that waits for
        // it: set aside, the rest go on.
        let broken = Uuid::new_v4();
        let broken_correlation =
            insert_request(&pool, broken, &requests, json!({"not": "a request"})).await;
        let mut waiting = entry_of(&request);
        waiting["correlation_id"] = json!(broken_correlation);
        insert_run(&pool, broken, "WAITING", waiting).await;

        let relay = sending_relay(&pool, settings(&bootstrap_servers(), &events, "sender")).await;
        let pass = relay.send_step_requests().await.unwrap();
        assert_eq!(
            (pass.sent, pass.unreadable, pass.deferred),
            (1, 1, 0),
            "{pass:?}"
        );

        let (sent, message) = first_request_on(&requests).await;
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
        let deadline = header("flotilla.deadline").expect("the deadline travels in a header");
        assert_eq!(
            DateTime::parse_from_rfc3339(&deadline).unwrap(),
            request.deadline(),
            "{deadline}"
        );
        assert!(header("traceparent").is_some_and(|t| t.contains(&job_id.simple().to_string())));

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

/// The relay was away (the target's topic unwritable, say) while the step
/// timed out, was asked again, or its job ended: back, it sends only the
/// request its step waits for now, and deletes the others unsent.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_request_nobody_waits_for_any_more_is_deleted_unsent(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let (events, requests) = (unique("sr-events"), unique("sr-requests"));
        create_topic(&events, 1).await.unwrap();
        create_topic(&requests, 1).await.unwrap();
        let ahead = Utc::now() + chrono::TimeDelta::minutes(1);
        let send = |amount: &str| {
            let job_id = Uuid::new_v4();
            (job_id, score_request(job_id, ahead, json!(amount)))
        };
        let mut unwanted = Vec::new();

        // Its deadline passed while the relay was away.
        let job = Uuid::new_v4();
        let past = Utc::now() - chrono::TimeDelta::seconds(1);
        let late = score_request(job, past, json!("past its deadline"));
        insert_run(&pool, job, "WAITING", entry_of(&late)).await;
        unwanted.push(late);
        // Timed out and asked again: the run names the new request, and
        // both wait in the outbox; only the new one goes.
        let (job, old) = send("superseded");
        let new = score_request(job, ahead, json!("the step's request now"));
        insert_run(&pool, job, "WAITING", entry_of(&new)).await;
        unwanted.push(old);
        // Answered already (a copy sent before the relay lost its ack).
        let (job, answered) = send("answered");
        let mut entry = entry_of(&answered);
        entry["reply"] = json!({"result": {"ok": true}, "received_at": Utc::now()});
        insert_run(&pool, job, "QUEUED", entry).await;
        unwanted.push(answered);
        // Its job was cancelled by an operator.
        let (job, cancelled) = send("job cancelled");
        insert_run(&pool, job, "CANCELLED", entry_of(&cancelled)).await;
        unwanted.push(cancelled);
        // Its job is gone (retention removed it).
        unwanted.push(send("job gone").1);
        // The step's entry no longer reads: taken as superseded, and the
        // rest of the read goes on.
        let (job, unreadable_entry) = send("entry broken");
        insert_run(
            &pool,
            job,
            "WAITING",
            json!({"correlation_id": "not a uuid"}),
        )
        .await;
        unwanted.push(unreadable_entry);

        for request in unwanted.iter().chain([&new]) {
            let payload = serde_json::to_value(request).unwrap();
            insert_request(&pool, request.job_id(), &requests, payload).await;
        }
        let relay = sending_relay(&pool, settings(&bootstrap_servers(), &events, "sender")).await;
        let pass = relay.send_step_requests().await.unwrap();
        assert_eq!(
            (pass.sent, pass.dropped, pass.unreadable, pass.deferred),
            (1, unwanted.len(), 0, 0),
            "{pass:?}"
        );
        assert_eq!(records_on(&requests), 1, "only the wanted request was sent");
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_step_request_outbox")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(left, 0, "the sent row and the unwanted ones are deleted");
        assert_eq!(first_request_on(&requests).await.0, new);
    })
    .await
    .expect("the test timed out");
}

/// A request larger than the relay's `message.max.bytes` is refused by its
/// producer, one larger than the topic's `max.message.bytes` by the broker:
/// either way it is set aside at once with its reason, not tried again
/// every minute while its step times out at every attempt.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_request_too_large_to_send_is_set_aside_not_retried(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let events = unique("sr-events");
        let (over_relay, over_topic) = (unique("sr-requests"), unique("sr-requests-small"));
        create_topic(&events, 1).await.unwrap();
        create_topic(&over_relay, 1).await.unwrap();
        flotilla_tests::create_topic_with(
            &bootstrap_servers(),
            &over_topic,
            1,
            &[("max.message.bytes", "2000")],
        )
        .await
        .unwrap();
        let ahead = Utc::now() + chrono::TimeDelta::minutes(1);
        let mut rows = Vec::new();
        for (topic, size) in [(&over_relay, 20_000), (&over_topic, 5_000)] {
            let job_id = Uuid::new_v4();
            let request = score_request(job_id, ahead, json!("x".repeat(size)));
            insert_run(&pool, job_id, "WAITING", entry_of(&request)).await;
            let payload = serde_json::to_value(&request).unwrap();
            insert_request(&pool, job_id, topic, payload).await;
            rows.push(job_id);
        }
        let mut relay_settings = settings(&bootstrap_servers(), &events, "sender");
        relay_settings.max_message_bytes = 10_000;
        let relay = sending_relay(&pool, relay_settings).await;
        let pass = relay.send_step_requests().await.unwrap();
        assert_eq!(
            (pass.sent, pass.unreadable, pass.deferred),
            (0, 2, 0),
            "{pass:?}"
        );
        for job_id in rows {
            let (error, next): (String, DateTime<Utc>) = sqlx::query_as(
                "SELECT last_error, next_attempt_at FROM workflow_step_request_outbox WHERE job_id = $1",
            )
            .bind(job_id)
            .fetch_one(&pool)
            .await
            .unwrap();
            assert!(error.to_lowercase().contains("too large"), "{error}");
            assert!(
                next > Utc::now() + chrono::TimeDelta::days(365),
                "set aside, not tried again: {next}"
            );
        }
        let again = relay.send_step_requests().await.unwrap();
        assert_eq!(again, Default::default(), "nothing is read again");
    })
    .await
    .expect("the test timed out");
}
