//! Steps whose target is a pair of Kafka topics, in the engine: the park
//! writes the request to the request outbox in its own transaction; a reply
//! matched by correlation id, on its request's reply topic and before its
//! deadline, completes the step on the job's next segment; repeats, replies
//! for earlier attempts, on another topic or late, refusals and timeouts
//! each get their own outcome; a request too large to send fails the job;
//! a row another session holds fails a reply within the lock wait. (The relay's sending and the consumer's reading are
//! tested in `relay/tests` and `worker/tests/consumer`.)

use std::time::Duration;

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_contracts::{WorkflowStepReply, WorkflowStepRequest};
use flotilla_store::runs::step_requests;
use flotilla_store::{Clock as _, RunStatus};
use flotilla_worker::engine::ops::reply::ReplyOutcome;
use flotilla_worker::engine::{Engine, Outcome};
use flotilla_worker::targets::Targets;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    Calls, checkpoint_names, echo_targets, event_types, manual_clock, row, settings, submit,
};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// prepare (echo) → score (the Kafka target `fraud`, told the amount;
/// its answer needs a numeric `score`) → decide (echo, told the score).
fn scoring() -> Value {
    json!({
        "name": "scoring", "input_schema": {}, "max_attempts": 3,
        "steps": [
            {"name": "prepare", "target": "echo", "method": "prepare"},
            {"name": "score", "target": "fraud", "method": "score", "rules": ["amount = input.amount"],
             "output_schema": {"type": "object", "required": ["score"],
                               "properties": {"score": {"type": "number"}}}},
            {"name": "decide", "target": "echo", "method": "decide",
             "rules": ["score = steps.score.score"]}
        ],
        "output": ["score = steps.decide.request.score"]
    })
}

fn targets(calls: &Calls, timeout: Duration) -> Targets {
    let mut targets = echo_targets(calls);
    targets.register_kafka(
        "fraud",
        flotilla_worker::test_support::kafka_target(timeout),
    );
    targets
}

async fn scoring_engine(
    pool: &PgPool,
    calls: &Calls,
) -> (Engine, std::sync::Arc<flotilla_store::ManualClock>) {
    kafka_engine(pool, calls, Duration::from_secs(30), settings("w")).await
}

/// An engine with `scoring`, on a manual clock, whose `fraud` requests
/// wait `timeout` for their replies.
async fn kafka_engine(
    pool: &PgPool,
    calls: &Calls,
    timeout: Duration,
    settings: flotilla_worker::engine::EngineSettings,
) -> (Engine, std::sync::Arc<flotilla_store::ManualClock>) {
    let clock = manual_clock();
    let engine = Engine::new(
        pool.clone(),
        targets(calls, timeout),
        clock.clone(),
        settings,
    );
    engine.register_workflow(&scoring()).await.unwrap();
    (engine, clock)
}

/// left and right, both to `fraud`, side by side; the result names each
/// answer's `side`.
fn pair() -> Value {
    json!({
        "name": "pair", "input_schema": {},
        "steps": [
            {"name": "left", "target": "fraud", "method": "score", "needs": []},
            {"name": "right", "target": "fraud", "method": "score", "needs": []}
        ],
        "output": ["left = steps.left.side", "right = steps.right.side"]
    })
}

/// The requests waiting in the outbox for `job_id`, decoded.
async fn outbox(pool: &PgPool, job_id: Uuid) -> Vec<(String, WorkflowStepRequest)> {
    let rows: Vec<(String, sqlx::types::Json<Value>)> = sqlx::query_as(
        "SELECT topic, payload FROM workflow_step_request_outbox WHERE job_id = $1 ORDER BY id",
    )
    .bind(job_id)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(topic, payload)| {
            let request = flotilla_contracts::json::decode_stored(payload.0).unwrap();
            (topic, request)
        })
        .collect()
}

/// Submits a `scoring` job for `amount` and runs it until it parks on its
/// Kafka step: the job and its request's correlation id.
async fn parked(engine: &Engine, pool: &PgPool, amount: i64) -> (Uuid, Uuid) {
    let job_id = submit(engine, "scoring", json!({"amount": amount})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    (job_id, outbox(pool, job_id).await[0].1.correlation_id())
}

/// The reply topic of the `fraud` target.
const REPLIES: &str = "fraud-replies";

async fn reply(engine: &Engine, job_id: Uuid, correlation_id: Uuid, result: Value) -> ReplyOutcome {
    let reply = WorkflowStepReply::answer(job_id, correlation_id, result).unwrap();
    engine.record_reply(&reply, REPLIES).await.unwrap()
}

async fn refusal(
    engine: &Engine,
    (job_id, correlation_id): (Uuid, Uuid),
    error: &str,
    retryable: bool,
) -> ReplyOutcome {
    let reply = WorkflowStepReply::refusal(job_id, correlation_id, error, retryable).unwrap();
    engine.record_reply(&reply, REPLIES).await.unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_kafka_step_parks_with_its_request_in_the_outbox_and_its_reply_completes_it(
    pool: PgPool,
) {
    let calls = Calls::default();
    let (engine, clock) = scoring_engine(&pool, &calls).await;
    let job_id = submit(&engine, "scoring", json!({"amount": 120})).await;
    assert_eq!(
        row(&pool, job_id).await.reader_level,
        flotilla_store::runs::KAFKA_READER_LEVEL,
        "earlier releases do not read step_requests"
    );

    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let parked = row(&pool, job_id).await;
    assert_eq!(parked.status, RunStatus::Waiting);
    assert_eq!(parked.outstanding_step.as_deref(), Some("score"));
    assert_eq!(parked.lease_owner, None, "no lease held while it waits");
    let sent = outbox(&pool, job_id).await;
    assert_eq!(sent.len(), 1, "the park wrote one request: {sent:?}");
    let (topic, request) = &sent[0];
    assert_eq!(topic, "fraud-requests");
    assert_eq!(request.request(), &json!({"amount": 120}));
    assert_eq!(request.reply_topic(), "fraud-replies");
    assert_eq!(request.idempotency_key(), format!("{job_id}:score"));
    assert_eq!(request.deadline(), clock.now() + Duration::from_secs(30));
    let entry = step_requests::entry_of(&parked, "score").unwrap().unwrap();
    assert_eq!(entry.correlation_id, request.correlation_id());
    assert_eq!(parked.reply_deadline, Some(request.deadline()));

    let outcome = reply(
        &engine,
        job_id,
        request.correlation_id(),
        json!({"score": 0.25}),
    )
    .await;
    assert_eq!(
        outcome,
        ReplyOutcome::Matched {
            step: "score".into(),
            woken: true
        }
    );
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Queued);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    let done = row(&pool, job_id).await;
    assert_eq!(done.result.unwrap().0, json!({"score": 0.25}));
    assert_eq!(
        calls.of(job_id),
        ["prepare", "decide"],
        "the Kafka step calls nothing"
    );
    assert_eq!(
        event_types(&pool, job_id).await,
        [
            E::Accepted,
            E::StepCheckpoint,
            E::Waiting,
            E::StepCheckpoint,
            E::StepCheckpoint,
            E::Completed
        ]
    );

    // The same reply again, now and after the job ended: dropped.
    let again = reply(
        &engine,
        job_id,
        request.correlation_id(),
        json!({"score": 0.25}),
    )
    .await;
    assert_eq!(again, ReplyOutcome::Dropped("repeat"));
    assert_eq!(
        reply(
            &engine,
            Uuid::new_v4(),
            request.correlation_id(),
            json!({"score": 1})
        )
        .await,
        ReplyOutcome::Dropped("unknown_job")
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_reply_that_arrives_twice_completes_the_step_once(pool: PgPool) {
    let calls = Calls::default();
    let (engine, _clock) = scoring_engine(&pool, &calls).await;
    let (job_id, correlation) = parked(&engine, &pool, 5).await;
    let first = reply(&engine, job_id, correlation, json!({"score": 1})).await;
    let second = reply(&engine, job_id, correlation, json!({"score": 2})).await;
    assert!(
        matches!(first, ReplyOutcome::Matched { woken: true, .. }),
        "{first:?}"
    );
    assert_eq!(
        second,
        ReplyOutcome::Dropped("repeat"),
        "the first reply stands"
    );
    // The repeat let go of the row when it returned: a transaction merely
    // dropped would hold its lock until its connection is used again, and a
    // claim (SKIP LOCKED) would pass the job by. Checked from a connection
    // of its own, outside the pool.
    let mut other = crate::support::own_connection(&pool).await;
    for n in 0..20 {
        let again = reply(&engine, job_id, correlation, json!({"score": 3})).await;
        assert_eq!(again, ReplyOutcome::Dropped("repeat"));
        crate::support::assert_unlocked(&mut other, job_id, &format!("repeat {n}")).await;
    }
    sqlx::Connection::close(other).await.unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        row(&pool, job_id).await.result.unwrap().0,
        json!({"score": 1})
    );
    let checkpoints = event_types(&pool, job_id)
        .await
        .into_iter()
        .filter(|t| *t == E::StepCheckpoint)
        .count();
    assert_eq!(checkpoints, 3, "one checkpoint per step");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_retryable_refusal_asks_again_with_a_new_correlation_id_and_the_old_one_is_stale(
    pool: PgPool,
) {
    let calls = Calls::default();
    let (engine, clock) = scoring_engine(&pool, &calls).await;
    let (job_id, first) = parked(&engine, &pool, 5).await;
    assert!(matches!(
        refusal(&engine, (job_id, first), "model warming up", true).await,
        ReplyOutcome::Matched { woken: true, .. }
    ));
    // The next segment fails the step by the retry rules: back off, then
    // the next attempt sends a new request.
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
    let requeued = row(&pool, job_id).await;
    assert!(
        requeued
            .error
            .as_deref()
            .unwrap()
            .contains("model warming up"),
        "{:?}",
        requeued.error
    );
    clock.advance(Duration::from_secs(3600));
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let sent = outbox(&pool, job_id).await;
    assert_eq!(sent.len(), 2, "a second request: {sent:?}");
    let second = sent[1].1.correlation_id();
    assert_ne!(first, second, "every attempt has its own correlation id");
    assert_eq!(sent[1].1.attempt(), 2);

    assert_eq!(
        reply(&engine, job_id, first, json!({"score": 9})).await,
        ReplyOutcome::Dropped("stale"),
        "a reply to the earlier attempt changes nothing"
    );
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Waiting);
    reply(&engine, job_id, second, json!({"score": 3})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        row(&pool, job_id).await.result.unwrap().0,
        json!({"score": 3})
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_refusal_that_is_not_retryable_fails_the_job_with_its_reason(pool: PgPool) {
    let calls = Calls::default();
    let (engine, _clock) = scoring_engine(&pool, &calls).await;
    let (job_id, correlation) = parked(&engine, &pool, 5).await;
    refusal(&engine, (job_id, correlation), "account closed", false).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let failed = row(&pool, job_id).await;
    assert_eq!(failed.status, RunStatus::Failed);
    assert!(
        failed.error.as_deref().unwrap().contains("account closed"),
        "{:?}",
        failed.error
    );
    assert_eq!(calls.of(job_id), ["prepare"], "decide never ran");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_reply_that_misfits_the_output_schema_fails_the_job(pool: PgPool) {
    let calls = Calls::default();
    let (engine, _clock) = scoring_engine(&pool, &calls).await;
    let (job_id, correlation) = parked(&engine, &pool, 5).await;
    reply(&engine, job_id, correlation, json!({"score": "high"})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Failed);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_request_past_its_deadline_is_retried_and_the_late_reply_is_dropped(pool: PgPool) {
    let calls = Calls::default();
    let (engine, clock) = kafka_engine(&pool, &calls, Duration::from_secs(5), settings("w")).await;
    let (job_id, first) = parked(&engine, &pool, 5).await;

    clock.advance(Duration::from_millis(4_999));
    assert_eq!(engine.wake_due_waits().await.unwrap(), 0, "not yet");
    clock.advance(Duration::from_millis(1));
    assert_eq!(engine.wake_due_waits().await.unwrap(), 1);
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Queued);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
    let requeued = row(&pool, job_id).await;
    assert!(
        requeued
            .error
            .as_deref()
            .unwrap()
            .contains("no reply on fraud-replies"),
        "{:?}",
        requeued.error
    );
    clock.advance(Duration::from_secs(3600));
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let second = outbox(&pool, job_id).await[1].1.correlation_id();
    assert_ne!(first, second);
    assert_eq!(
        reply(&engine, job_id, first, json!({"score": 1})).await,
        ReplyOutcome::Dropped("stale"),
        "the late reply to the timed-out request"
    );
    reply(&engine, job_id, second, json!({"score": 2})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        row(&pool, job_id).await.result.unwrap().0,
        json!({"score": 2})
    );
}

/// A reply that lands while the job runs another branch is kept; the park
/// that follows sees it and requeues at once instead of waiting.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_reply_kept_while_the_job_ran_is_taken_by_its_next_segment(pool: PgPool) {
    let calls = Calls::default();
    let (engine, _clock) = scoring_engine(&pool, &calls).await;
    let (job_id, correlation) = parked(&engine, &pool, 5).await;
    // As if another worker held the job: RUNNING when the reply lands.
    sqlx::query(
        "UPDATE workflow_run SET status = 'RUNNING', lease_owner = 'other',
             lease_until = now() + interval '1 hour', lease_token = gen_random_uuid()
         WHERE job_id = $1",
    )
    .bind(job_id)
    .execute(&pool)
    .await
    .unwrap();
    let kept = reply(&engine, job_id, correlation, json!({"score": 4})).await;
    assert_eq!(
        kept,
        ReplyOutcome::Matched {
            step: "score".into(),
            woken: false
        }
    );
    // Queued again as a wake does it: the attempt given back.
    sqlx::query(
        "UPDATE workflow_run SET status = 'QUEUED', attempt = attempt - 1,
             lease_owner = NULL, lease_until = NULL, lease_token = NULL
         WHERE job_id = $1",
    )
    .bind(job_id)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        row(&pool, job_id).await.result.unwrap().0,
        json!({"score": 4})
    );
}

/// The reply lands while the job runs another branch after a wake (here a
/// human step's completion): the segment's claim did not see it, so the
/// park that ends the segment finds it and queues the job again at once
/// instead of waiting for a reply that already came.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_reply_that_lands_mid_segment_requeues_the_park_that_ends_it(pool: PgPool) {
    use std::sync::Arc;
    use tokio::sync::Notify;
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let calls = Calls::default();
    let mut targets = targets(&calls, Duration::from_secs(30));
    targets.register(
        "slow",
        Arc::new(flotilla_worker::targets::FnTarget({
            let (started, release) = (started.clone(), release.clone());
            move |_call: flotilla_worker::targets::TargetCall| {
                let (started, release) = (started.clone(), release.clone());
                async move {
                    started.notify_one();
                    release.notified().await;
                    Ok::<_, flotilla_worker::targets::StepFailure>(json!({"done": true}))
                }
            }
        })),
        4,
    );
    let engine = Engine::new(pool.clone(), targets, manual_clock(), settings("w"));
    // approve (a human's) and score (Kafka) side by side; work after approve.
    let document = json!({
        "name": "reviewed", "input_schema": {},
        "steps": [
            {"name": "approve", "target": "echo", "method": "approve", "completion": "external", "needs": []},
            {"name": "score", "target": "fraud", "method": "score", "rules": ["amount = 1"], "needs": []},
            {"name": "work", "target": "slow", "method": "work", "needs": ["approve"]}
        ],
        "output": ["risk = steps.score.risk"]
    });
    engine.register_workflow(&document).await.unwrap();
    let job_id = submit(&engine, "reviewed", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let correlation = outbox(&pool, job_id).await[0].1.correlation_id();

    engine
        .complete_step(job_id, "approve", json!({"ok": true}))
        .await
        .unwrap();
    let running = tokio::spawn({
        let engine = engine.clone();
        async move { engine.run_once().await.unwrap() }
    });
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("work never started");
    let kept = reply(&engine, job_id, correlation, json!({"risk": 0.1})).await;
    assert_eq!(
        kept,
        ReplyOutcome::Matched {
            step: "score".into(),
            woken: false
        },
        "the job runs: the reply is kept, the segment left alone"
    );
    release.notify_one();
    assert_eq!(running.await.unwrap(), Outcome::Parked(job_id));
    let parked = row(&pool, job_id).await;
    assert_eq!(
        parked.status,
        RunStatus::Queued,
        "the park found the reply and queued the job instead of waiting"
    );
    assert_eq!(outbox(&pool, job_id).await.len(), 1, "no second request");
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        row(&pool, job_id).await.result.unwrap().0,
        json!({"risk": 0.1})
    );
}

/// An engine whose `fraud` target lets `cap` requests await replies at
/// once, its `scoring` segments given `deadline_ms` (the patience of a wait
/// for a slot) and its lease `lease`.
async fn capped_engine(
    pool: &PgPool,
    calls: &Calls,
    (cap, deadline_ms): (usize, u64),
    lease: Duration,
) -> (Engine, std::sync::Arc<flotilla_store::ManualClock>) {
    let mut targets = echo_targets(calls);
    let mut fraud = flotilla_worker::test_support::kafka_target(Duration::from_secs(30));
    fraud.max_concurrent = Some(cap);
    targets.register_kafka("fraud", fraud);
    let clock = manual_clock();
    let mut settings = settings("w");
    settings.lease = lease;
    let engine = Engine::new(pool.clone(), targets, clock.clone(), settings);
    let mut workflow = scoring();
    workflow["deadline_ms"] = json!(deadline_ms);
    engine.register_workflow(&workflow).await.unwrap();
    (engine, clock)
}

async fn slots_held(pool: &PgPool, clock: &flotilla_store::ManualClock) -> i64 {
    flotilla_store::runs::target_slots::held(pool, "fraud", clock.now())
        .await
        .unwrap()
}

/// Capped at 2: a third job finds both slots held, waits out its patience
/// (the segment's 300 ms) and is retried with nothing sent; a reply gives
/// its slot back in the reply's own transaction, and the third job's next
/// attempt sends.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_capped_kafka_target_sends_no_request_past_its_cap_until_a_reply_frees_a_slot(
    pool: PgPool,
) {
    let calls = Calls::default();
    let (engine, clock) = capped_engine(&pool, &calls, (2, 300), Duration::from_secs(60)).await;
    let (first, first_request) = parked(&engine, &pool, 1).await;
    let _second = parked(&engine, &pool, 2).await;
    assert_eq!(slots_held(&pool, &clock).await, 2);

    let third = submit(&engine, "scoring", json!({"amount": 3})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(third));
    assert!(
        outbox(&pool, third).await.is_empty(),
        "nothing sent past the cap"
    );
    let waited = row(&pool, third).await;
    let error = waited.error.clone().unwrap_or_default();
    assert!(
        error.contains("all 2 requests target fraud may have awaiting replies stayed unanswered"),
        "{error}"
    );
    assert_eq!(slots_held(&pool, &clock).await, 2, "the third took none");

    reply(&engine, first, first_request, json!({"score": 1})).await;
    assert_eq!(
        slots_held(&pool, &clock).await,
        1,
        "the reply gave its slot back"
    );

    // Past the third job's backoff (well within the second's deadline).
    let backoff = (waited.run_after - clock.now()).to_std().unwrap();
    assert!(backoff < Duration::from_secs(30), "{backoff:?}");
    clock.advance(backoff);
    let mut outcomes = Vec::new();
    loop {
        match engine.run_once().await.unwrap() {
            Outcome::Idle => break,
            outcome => outcomes.push(outcome),
        }
    }
    assert!(
        outcomes.contains(&Outcome::Completed(first)),
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&Outcome::Parked(third)), "{outcomes:?}");
    assert_eq!(
        outbox(&pool, third).await.len(),
        1,
        "sent once a slot was free"
    );
    assert_eq!(
        slots_held(&pool, &clock).await,
        2,
        "the second's and the third's"
    );
}

/// Capped at 1: a job that ends gives its slot back (cancelled while it
/// waited), and so does a request past its deadline; the next job sends
/// at once each time, without waiting.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_slot_frees_when_its_job_ends_and_when_its_request_runs_out(pool: PgPool) {
    let calls = Calls::default();
    let (engine, clock) = capped_engine(&pool, &calls, (1, 300), Duration::from_secs(60)).await;
    let (first, _) = parked(&engine, &pool, 1).await;
    assert!(matches!(
        engine.cancel(first, "withdrawn").await.unwrap(),
        flotilla_worker::engine::Cancelled::Done(_)
    ));
    assert_eq!(
        slots_held(&pool, &clock).await,
        0,
        "a finished job holds none"
    );
    let (second, _) = parked(&engine, &pool, 2).await;
    assert_eq!(slots_held(&pool, &clock).await, 1);

    clock.advance(Duration::from_secs(30));
    assert_eq!(slots_held(&pool, &clock).await, 0, "past its deadline");
    let (third, _) = parked(&engine, &pool, 3).await;
    assert_eq!(outbox(&pool, third).await.len(), 1);
    assert_eq!(outbox(&pool, second).await.len(), 1);
}

/// A segment waiting for a slot is cancelled within a heartbeat: it stops
/// waiting, sends nothing and takes no slot.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_cancelled_while_it_waits_for_a_slot_ends_cancelled_with_nothing_sent(pool: PgPool) {
    let calls = Calls::default();
    let (engine, clock) = capped_engine(&pool, &calls, (1, 60_000), Duration::from_secs(1)).await;
    let _first = parked(&engine, &pool, 1).await;
    let second = submit(&engine, "scoring", json!({"amount": 2})).await;
    let running = tokio::spawn({
        let engine = engine.clone();
        async move { engine.run_once().await.unwrap() }
    });
    // Its first step checkpointed: the segment is at the Kafka step, waiting.
    crate::support::eventually(Duration::from_secs(10), "the first checkpoint", || async {
        crate::support::checkpoint_names(&row(&pool, second).await).contains(&"prepare".into())
    })
    .await;
    assert!(!running.is_finished(), "it waits for the slot");
    assert!(matches!(
        engine.cancel(second, "withdrawn").await.unwrap(),
        flotilla_worker::engine::Cancelled::Asked(_)
    ));
    let outcome = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the wait never stopped")
        .unwrap();
    assert_eq!(outcome, Outcome::Cancelled(second));
    assert_eq!(row(&pool, second).await.status, RunStatus::Cancelled);
    assert!(outbox(&pool, second).await.is_empty());
    let taken: i64 =
        sqlx::query_scalar("SELECT count(*) FROM workflow_target_slot WHERE job_id = $1")
            .bind(second)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(taken, 0, "no slot taken");
    assert_eq!(slots_held(&pool, &clock).await, 1, "the first's");
}

/// A late reply to an earlier request of the step frees nothing: the slot
/// belongs to the request the step's current attempt took it for.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_late_reply_to_an_earlier_request_keeps_the_new_requests_slot(pool: PgPool) {
    let calls = Calls::default();
    let (engine, clock) = capped_engine(&pool, &calls, (1, 300), Duration::from_secs(60)).await;
    let (job_id, first) = parked(&engine, &pool, 1).await;
    // The step's next attempt took the slot for its own request, and has
    // not parked yet: the row still names the first request.
    let second = Uuid::new_v4();
    let claim = flotilla_store::runs::target_slots::Claim {
        target: "fraud",
        job_id,
        step: "score",
        correlation_id: second,
        expires_at: clock.now() + Duration::from_secs(30),
    };
    assert_eq!(
        flotilla_store::runs::target_slots::take(&pool, claim, 1, clock.now())
            .await
            .unwrap(),
        flotilla_store::runs::target_slots::Take::Taken,
        "the job takes its own slot over"
    );
    assert!(matches!(
        reply(&engine, job_id, first, json!({"score": 1})).await,
        ReplyOutcome::Matched { .. }
    ));
    assert_eq!(
        slots_held(&pool, &clock).await,
        1,
        "the second request's slot stays"
    );
}

/// Two steps of one job to a target capped at 1 run side by side: a job's
/// own slots never block it, so both requests leave with one park.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_jobs_parallel_requests_to_a_capped_target_count_as_one(pool: PgPool) {
    let calls = Calls::default();
    let (engine, clock) = capped_engine(&pool, &calls, (1, 30_000), Duration::from_secs(60)).await;
    engine.register_workflow(&pair()).await.unwrap();
    let job_id = submit(&engine, "pair", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let sent: Vec<String> = outbox(&pool, job_id)
        .await
        .into_iter()
        .map(|(_, request)| request.step_name().to_owned())
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(slots_held(&pool, &clock).await, 1, "one job");
}

/// A principal that reads target A's request topic sees its correlation
/// ids and may write to target B's reply topic: a reply there, naming A's
/// request, is not A's answer. The fleet reads every reply topic in one
/// group, so the topic it came on is checked against the request's.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_reply_on_another_targets_reply_topic_is_dropped_and_the_step_still_waits(pool: PgPool) {
    let calls = Calls::default();
    let (engine, _clock) = scoring_engine(&pool, &calls).await;
    let (job_id, correlation) = parked(&engine, &pool, 5).await;
    let forged = WorkflowStepReply::answer(job_id, correlation, json!({"score": 0})).unwrap();
    assert_eq!(
        engine.record_reply(&forged, "other-replies").await.unwrap(),
        ReplyOutcome::Dropped("wrong_topic")
    );
    let waiting = row(&pool, job_id).await;
    assert_eq!(waiting.status, RunStatus::Waiting, "not woken");
    let entry = step_requests::entry_of(&waiting, "score").unwrap().unwrap();
    assert_eq!(entry.reply, None, "nothing kept");

    reply(&engine, job_id, correlation, json!({"score": 0.5})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        row(&pool, job_id).await.result.unwrap().0,
        json!({"score": 0.5}),
        "the answer on the right topic stands"
    );
}

/// A job parked on a signal's wait with a request to the fraud target sent
/// beside it.
async fn parked_on_approval_with_a_request(engine: &Engine) -> Uuid {
    engine
        .register_workflow(&json!({
            "name": "approved_scoring", "input_schema": {},
            "steps": [
                {"name": "approve", "wait_for": "approved", "needs": []},
                {"name": "score", "target": "fraud", "method": "score", "rules": ["amount = 1"], "needs": []}
            ]
        }))
        .await
        .unwrap();
    let job_id = submit(engine, "approved_scoring", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    job_id
}

/// approve (a signal) and score (Kafka, 5 s) side by side: score's
/// deadline passes while the job waits for the signal too, and its reply
/// comes before the sweep. The late reply neither wakes the job (status,
/// outstanding step, deadline and attempt as they were) nor answers the
/// step: the sweep times it out as it would have without the reply.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_late_reply_does_not_wake_a_job_waiting_for_a_signal_nor_answer_the_timed_out_step(
    pool: PgPool,
) {
    let calls = Calls::default();
    let (engine, clock) = kafka_engine(&pool, &calls, Duration::from_secs(5), settings("w")).await;
    let job_id = parked_on_approval_with_a_request(&engine).await;
    let correlation = outbox(&pool, job_id).await[0].1.correlation_id();
    let before = row(&pool, job_id).await;
    assert_eq!(before.status, RunStatus::Waiting);

    clock.advance(Duration::from_secs(5));
    assert_eq!(
        reply(&engine, job_id, correlation, json!({"score": 1})).await,
        ReplyOutcome::Dropped("late")
    );
    let after = row(&pool, job_id).await;
    assert_eq!(
        (
            after.status,
            &after.outstanding_step,
            after.reply_deadline,
            after.attempt
        ),
        (
            RunStatus::Waiting,
            &before.outstanding_step,
            before.reply_deadline,
            before.attempt
        ),
        "the job was not woken"
    );
    let entry = step_requests::entry_of(&after, "score").unwrap().unwrap();
    assert_eq!(entry.reply, None, "the late reply is not kept");

    assert_eq!(engine.wake_due_waits().await.unwrap(), 1);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
    let error = row(&pool, job_id).await.error.unwrap_or_default();
    assert!(error.contains("no reply on fraud-replies"), "{error}");
}

/// A reply in time wakes a job parked on another step (here a signal's
/// wait): its next segment takes the reply and parks again on the wait.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_reply_in_time_wakes_a_job_parked_on_another_step_and_it_parks_again(pool: PgPool) {
    let calls = Calls::default();
    let (engine, clock) = kafka_engine(&pool, &calls, Duration::from_secs(5), settings("w")).await;
    let job_id = parked_on_approval_with_a_request(&engine).await;
    assert_eq!(
        row(&pool, job_id).await.outstanding_step.as_deref(),
        Some("approve")
    );
    let correlation = outbox(&pool, job_id).await[0].1.correlation_id();

    clock.advance(Duration::from_secs(1));
    assert!(matches!(
        reply(&engine, job_id, correlation, json!({"score": 1})).await,
        ReplyOutcome::Matched { woken: true, .. }
    ));
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Queued);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let parked = row(&pool, job_id).await;
    assert_eq!(parked.outstanding_step.as_deref(), Some("approve"));
    assert_eq!(checkpoint_names(&parked), ["score"], "the reply is taken");
    assert_eq!(parked.reply_deadline, None, "no request left to time out");
    assert_eq!(parked.attempt, 1, "waking spent no attempt");
}

/// Why a reply is not also checked against the row's attempt: a reply
/// wakes a WAITING job by giving its attempt back, so while it is queued
/// the row's attempt is one below the attempt its requests were sent by.
/// A reply to the job's other request arriving then is good, and kept; the
/// correlation id, fresh for every request, already tells an earlier
/// attempt's reply (stale).
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_reply_to_a_parallel_request_while_another_reply_has_queued_the_job_is_kept(
    pool: PgPool,
) {
    let calls = Calls::default();
    let (engine, _clock) = scoring_engine(&pool, &calls).await;
    engine.register_workflow(&pair()).await.unwrap();
    let job_id = submit(&engine, "pair", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let sent = outbox(&pool, job_id).await;
    let correlation_of = |step: &str| {
        sent.iter()
            .find(|(_, request)| request.step_name() == step)
            .map(|(_, request)| request.correlation_id())
            .unwrap()
    };
    // Each step answered with its own name.
    let answer = async |step: &str| {
        let correlation = correlation_of(step);
        reply(&engine, job_id, correlation, json!({"side": step})).await
    };
    let parked_attempt = row(&pool, job_id).await.attempt;
    assert!(matches!(
        answer("left").await,
        ReplyOutcome::Matched { woken: true, .. }
    ));
    let queued = row(&pool, job_id).await;
    assert_eq!(queued.status, RunStatus::Queued);
    assert_ne!(
        queued.attempt, parked_attempt,
        "the wake gave the attempt back"
    );
    assert_eq!(
        answer("right").await,
        ReplyOutcome::Matched {
            step: "right".into(),
            woken: false
        }
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(
        row(&pool, job_id).await.result.unwrap().0,
        json!({"left": "left", "right": "right"})
    );
    assert_eq!(outbox(&pool, job_id).await.len(), 2, "nothing asked again");
}

/// A request whose record would be larger than the relay publishes
/// (`max_event_bytes`, the relay's `--max-message-bytes`) is never
/// written: the job fails at once naming the sizes, rather than its step
/// timing out at every attempt behind a request the relay cannot send.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_request_larger_than_a_record_may_be_fails_the_job_naming_its_size(pool: PgPool) {
    let calls = Calls::default();
    let mut settings = settings("w");
    settings.max_event_bytes = 8_192;
    let (engine, _clock) = kafka_engine(&pool, &calls, Duration::from_secs(30), settings).await;
    let fits = submit(&engine, "scoring", json!({"amount": "x".repeat(4_000)})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(fits));

    let job_id = submit(&engine, "scoring", json!({"amount": "x".repeat(10_000)})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let failed = row(&pool, job_id).await;
    let error = failed.error.unwrap_or_default();
    assert!(
        error.contains("the request to fraud-requests is 10")
            && error.contains("over the limit of 8192 bytes"),
        "{error}"
    );
    assert!(outbox(&pool, job_id).await.is_empty(), "nothing to send");
}

/// An operator's session holds the job's row (`BEGIN; SELECT … FOR
/// UPDATE`, left open): a reply for it fails within the lock wait, as
/// about the world (the consumer pauses and tries the batch again; never
/// a dead letter), instead of stalling its batch past
/// `max.poll.interval.ms`; once the row is let go the same reply is kept.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_reply_for_a_row_another_session_holds_fails_within_the_lock_wait_and_is_kept_later(
    pool: PgPool,
) {
    let calls = Calls::default();
    let mut settings = settings("w");
    settings.lease = Duration::from_secs(2);
    let (engine, _clock) = kafka_engine(&pool, &calls, Duration::from_secs(30), settings).await;
    assert_eq!(engine.row_lock_wait(), Duration::from_millis(200));
    let (job_id, correlation) = parked(&engine, &pool, 5).await;

    let operator = crate::support::RowHeld::by_another_session(&pool, job_id).await;
    let answer = WorkflowStepReply::answer(job_id, correlation, json!({"score": 2})).unwrap();
    let held = operator
        .fails_within_the_lock_wait(engine.record_reply(&answer, REPLIES))
        .await;
    assert!(held.is_a_blocked_row(), "{held:?}");
    assert!(
        !held.is_about_the_data(),
        "about the world: the batch is retried, not dead-lettered"
    );

    operator.let_go().await;
    assert_eq!(
        engine.record_reply(&answer, REPLIES).await.unwrap(),
        ReplyOutcome::Matched {
            step: "score".into(),
            woken: true
        }
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
}
