//! Signals from the signal topic, read in the request consumer's batches:
//! Avro and JSON signals reach their jobs (before and after their waits),
//! a repeat changes nothing, and each refused one is dead-lettered to
//! `<signal topic>.dlq` with its reason; offsets move past every one.

use super::*;

use flotilla_contracts::WorkflowRunSignal;
use flotilla_store::RunStatus;
use flotilla_worker::engine::Outcome;
use support::{Topics, codec, produce_raw};

/// The signal topic of `topics`, and its dead-letter topic.
async fn signal_topics() -> (String, String) {
    let signals = flotilla_tests::unique("signals");
    let dead = flotilla_contracts::topics::dead_letter_topic(&signals);
    flotilla_tests::create_topic(&signals, support::PARTITIONS)
        .await
        .unwrap();
    flotilla_tests::create_topic(&dead, 1).await.unwrap();
    (signals, dead)
}

fn consumer(
    engine: &flotilla_worker::engine::Engine,
    topics: &Topics,
    signals: &str,
) -> flotilla_worker::ingest::RequestConsumer {
    let mut settings = flotilla_worker::ingest::ConsumerSettings::new(
        flotilla_tests::broker(),
        &topics.requests,
        &topics.group,
    );
    settings.signal_topic = Some(signals.to_owned());
    settings.outage_backoff_max = Duration::from_millis(500);
    flotilla_worker::ingest::RequestConsumer::subscribe(engine.clone(), codec(), settings).unwrap()
}

async fn signal_bytes(topic: &str, signal: &WorkflowRunSignal, avro: bool) -> Vec<u8> {
    if avro {
        codec().encode(topic, signal).await.unwrap()
    } else {
        flotilla_contracts::json::encode(signal).unwrap()
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn signals_from_the_topic_reach_their_jobs_and_refused_ones_are_dead_lettered(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let (signals, dead) = signal_topics().await;
        let engine = support::engine(&pool);
        engine
            .register_workflow(&json!({
                "name": "payment", "input_schema": {},
                "steps": [
                    {"name": "invoice", "target": "echo", "method": "invoice"},
                    {"name": "paid", "wait_for": "settled"}
                ]
            }))
            .await
            .unwrap();
        let submit = |job_id: Uuid| support::submit_stored(&engine, job_id, "payment");
        // `parked` waits already; `early` has not reached its wait.
        let (parked, early) = (Uuid::new_v4(), Uuid::new_v4());
        submit(parked).await;
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(parked));
        submit(early).await;

        let (stop, handle) = spawn(consumer(&engine, &topics, &signals));
        let producer = producer();
        let send = |job_id: Uuid, payload: serde_json::Value, key: Option<&str>, avro: bool| {
            let (producer, signals) = (producer.clone(), signals.clone());
            let signal = WorkflowRunSignal::new(
                job_id,
                "settled",
                payload,
                json!({"via": "kafka"}),
                key.map(str::to_owned),
            )
            .unwrap();
            async move {
                let bytes = signal_bytes(&signals, &signal, avro).await;
                produce_raw(&producer, &signals, &job_id.to_string(), &bytes, None).await;
            }
        };
        send(parked, json!({"amount": 3}), None, true).await;
        send(early, json!({"amount": 4}), Some("e-1"), false).await;
        send(early, json!({"amount": 4}), Some("e-1"), false).await;
        send(early, json!({"amount": 5}), Some("e-1"), true).await;
        send(Uuid::new_v4(), json!({}), None, false).await;
        produce_raw(&producer, &signals, "junk", b"{not a signal", None).await;

        let letters = support::dead_letters(&dead, 3).await;
        let mut codes: Vec<&str> = letters.iter().map(|l| l.headers[CODE].as_str()).collect();
        codes.sort_unstable();
        assert_eq!(codes, ["conflict", "json_mismatch", "unknown_job"]);
        for letter in &letters {
            assert_eq!(letter.headers[SOURCE_TOPIC], signals);
            assert!(!letter.headers[REASON].is_empty());
        }
        support::wait_committed_to_end(&signals, &topics.group).await;
        assert_eq!(
            support::dead_letter_count(&dead),
            3,
            "a repeat is no dead letter"
        );

        let woken = engine.signals(parked).await.unwrap();
        assert_eq!(woken.len(), 1);
        assert!(
            woken[0].idempotency_key.starts_with("kafka:"),
            "{:?}",
            woken[0]
        );
        assert_eq!(woken[0].source, json!({"via": "kafka"}));
        assert_eq!(engine.signals(early).await.unwrap().len(), 1);
        stop.cancel();
        handle.await.unwrap();

        let mut finished = Vec::new();
        for _ in 0..2 {
            finished.push(engine.run_once().await.unwrap());
        }
        assert!(
            finished.contains(&Outcome::Completed(parked)),
            "{finished:?}"
        );
        assert!(
            finished.contains(&Outcome::Completed(early)),
            "{finished:?}"
        );
        for (job_id, amount) in [(parked, 3), (early, 4)] {
            let status: (RunStatus, serde_json::Value) =
                sqlx::query_as("SELECT status, result FROM workflow_run WHERE job_id = $1")
                    .bind(job_id)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(status, (RunStatus::Completed, json!({"amount": amount})));
        }
    })
    .await;
}
