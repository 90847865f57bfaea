//! The reply consumer of Kafka targets, in a group with no offset anywhere
//! (a new group: none in Kafka, none in the database), starts at the first
//! record since the earliest request still waiting (less five minutes for
//! the responder's clock), not at the reply topic's start: a reply topic
//! holds a retention's worth of answers to requests long settled.

use super::*;

use std::sync::Arc;

use flotilla_contracts::WorkflowStepReply;
use flotilla_store::runs::step_requests;
use flotilla_worker::engine::{Engine, EngineSettings, Outcome, SystemClock};
use flotilla_worker::ingest::{ConsumerSettings, RequestConsumer};
use flotilla_worker::targets::kafka::{Encoding, KafkaTarget};
use rdkafka::producer::FutureRecord;

/// An engine whose `fraud` target replies on `replies`, with `scoring`
/// (one step to it) stored.
async fn scoring_engine(pool: &PgPool, replies: &str) -> Engine {
    let mut targets = flotilla_worker::test_support::echo_targets();
    targets.register_kafka(
        "fraud",
        KafkaTarget {
            request_topic: flotilla_tests::unique("fraud-requests"),
            reply_topic: replies.to_owned(),
            encoding: Some(Encoding::Json),
            timeout: Duration::from_secs(600),
            max_concurrent: None,
        },
    );
    let engine = Engine::new(
        pool.clone(),
        targets,
        Arc::new(SystemClock),
        EngineSettings::new("replies-test"),
    );
    engine
        .register_workflow(&json!({
            "name": "scoring", "input_schema": {},
            "steps": [{"name": "score", "target": "fraud", "method": "score"}]
        }))
        .await
        .unwrap();
    engine
}

/// A `scoring` job run until it parks on its request: the job and the
/// request's correlation id.
async fn parked(engine: &Engine, pool: &PgPool) -> (Uuid, Uuid) {
    let job_id = Uuid::new_v4();
    support::submit_stored(engine, job_id, "scoring").await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let entry = step_requests::entry_of(&row_of(pool, job_id).await, "score")
        .unwrap()
        .unwrap();
    (job_id, entry.correlation_id)
}

async fn row_of(pool: &PgPool, job_id: Uuid) -> flotilla_store::runs::RunRow {
    let mut conn = pool.acquire().await.unwrap();
    flotilla_store::runs::get(&mut conn, job_id)
        .await
        .unwrap()
        .unwrap()
}

async fn reply_on(
    topic: &str,
    job_id: Uuid,
    correlation_id: Uuid,
    stamped: chrono::DateTime<chrono::Utc>,
) {
    let reply = WorkflowStepReply::answer(job_id, correlation_id, json!({"score": 1})).unwrap();
    let payload = flotilla_contracts::json::encode(&reply).unwrap();
    let key = job_id.to_string();
    producer()
        .send(
            FutureRecord::to(topic)
                .partition(0)
                .key(&key)
                .payload(&payload)
                .timestamp(stamped.timestamp_millis()),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

async fn has_reply(pool: &PgPool, job_id: Uuid) -> bool {
    step_requests::entry_of(&row_of(pool, job_id).await, "score")
        .unwrap()
        .unwrap()
        .reply
        .is_some()
}

/// Two jobs wait, their requests made now. A record stamped an hour ago
/// (before the earliest waiting request, past the margin) stands for the
/// topic's old answers: a new group does not read it. The answer stamped
/// now is read and matched.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_new_reply_group_starts_at_the_earliest_waiting_request_not_the_topics_start(
    pool: PgPool,
) {
    within_deadline(async {
        let replies = flotilla_tests::unique("fraud-replies");
        flotilla_tests::create_topic(&replies, support::PARTITIONS)
            .await
            .unwrap();
        flotilla_tests::create_topic(&flotilla_contracts::topics::dead_letter_topic(&replies), 1)
            .await
            .unwrap();
        let engine = scoring_engine(&pool, &replies).await;
        let (old, old_correlation) = parked(&engine, &pool).await;
        let (new, new_correlation) = parked(&engine, &pool).await;
        let now = chrono::Utc::now();
        reply_on(
            &replies,
            old,
            old_correlation,
            now - chrono::Duration::hours(1),
        )
        .await;
        reply_on(&replies, new, new_correlation, now).await;

        let group = flotilla_tests::unique("replies");
        let mut settings =
            ConsumerSettings::new(flotilla_tests::broker(), &replies, &group).for_replies(&group);
        settings.reply_topics = vec![replies.clone()];
        settings.outage_backoff_max = Duration::from_millis(500);
        let consumer =
            RequestConsumer::subscribe(engine.clone(), support::codec(), settings).unwrap();
        let (stop, handle) = spawn(consumer);
        while !has_reply(&pool, new).await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        support::wait_committed_to_end(&replies, &group).await;
        stop.cancel();
        handle.await.unwrap();
        assert!(
            !has_reply(&pool, old).await,
            "the record stamped an hour before the earliest waiting request was read"
        );
    })
    .await;
}
