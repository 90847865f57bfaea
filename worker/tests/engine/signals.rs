//! Signals: a `wait_for` step takes the signal of its name, sent before
//! the job reaches it or after it parked, through the one door every
//! channel shares (`Engine::send_signal`); repeats, conflicts and signals
//! nobody can take get their own answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::ops::signal::{Signal, SignalError, SignalReceipt};
use flotilla_worker::engine::{Engine, Outcome};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::support::{
    Calls, echo_targets, event_types, events, manual_clock, row, settings, submit,
};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// invoice (echo) → paid (waits for `payment-settled`, an amount above
/// 0) → ship (echo, told the amount).
fn payment() -> Value {
    json!({
        "name": "payment", "input_schema": {},
        "steps": [
            {"name": "invoice", "target": "echo", "method": "invoice"},
            {"name": "paid", "wait_for": "payment-settled",
             "output_schema": {"type": "object", "required": ["amount"]},
             "validate": ["response.amount > 0"]},
            {"name": "ship", "target": "echo", "method": "ship", "rules": ["amount = steps.paid.amount"]}
        ],
        "output": ["shipped = steps.ship.request.amount"]
    })
}

async fn engine_with(pool: &PgPool, targets: Targets, document: &Value) -> Engine {
    let engine = Engine::new(pool.clone(), targets, manual_clock(), settings("w"));
    engine.register_workflow(document).await.unwrap();
    engine
}

fn signal(job_id: Uuid, key: &str, payload: Value) -> Signal {
    Signal {
        job_id,
        name: "payment-settled".into(),
        payload,
        source: json!({"system": "ledger"}),
        idempotency_key: key.into(),
    }
}

async fn send(engine: &Engine, signal: Signal) -> SignalReceipt {
    engine.send_signal(signal).await.unwrap()
}

/// The verdicts of the job's events of type `kind`.
async fn verdicts(pool: &PgPool, job_id: Uuid, kind: E) -> Vec<String> {
    events(pool, job_id)
        .await
        .iter()
        .filter(|e| e.event_type() == kind)
        .filter_map(|e| e.verdict().map(str::to_owned))
        .collect()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_sent_after_the_job_parked_requeues_it_and_becomes_the_steps_output(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine_with(&pool, echo_targets(&calls), &payment()).await;
    let job_id = submit(&engine, "payment", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let parked = row(&pool, job_id).await;
    assert_eq!(parked.status, RunStatus::Waiting);
    assert_eq!(parked.outstanding_step.as_deref(), Some("paid"));

    let receipt = send(&engine, signal(job_id, "settle-1", json!({"amount": 42}))).await;
    assert_eq!(
        (receipt.seq, receipt.repeat, receipt.woke_job),
        (1, false, true)
    );
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Queued);

    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    let done = row(&pool, job_id).await;
    assert_eq!(done.result.unwrap().0, json!({"shipped": 42}));
    assert_eq!(
        calls.of(job_id),
        ["invoice", "ship"],
        "a wait calls nothing"
    );
    assert_eq!(
        verdicts(&pool, job_id, E::Accepted).await,
        ["signal 1 received: payment-settled"]
    );
    assert_eq!(
        verdicts(&pool, job_id, E::StepCheckpoint).await,
        ["signal 1"],
        "the wait's checkpoint names the signal it took"
    );
    let history = engine.signals(job_id).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].consumed_by.as_deref(), Some("paid"));
    assert_eq!(history[0].payload, json!({"amount": 42}));
    assert_eq!(history[0].source, json!({"system": "ledger"}));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_sent_before_the_wait_is_kept_and_taken_without_parking(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine_with(&pool, echo_targets(&calls), &payment()).await;
    let job_id = submit(&engine, "payment", json!({})).await;
    let receipt = send(&engine, signal(job_id, "early", json!({"amount": 7}))).await;
    assert!(!receipt.consumed);
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Queued);

    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    let types: Vec<E> = events(&pool, job_id)
        .await
        .iter()
        .map(|e| e.event_type())
        .collect();
    assert!(!types.contains(&E::Waiting), "it never parked: {types:?}");
    assert_eq!(
        row(&pool, job_id).await.result.unwrap().0,
        json!({"shipped": 7})
    );
}

/// A target `slow` that says when it started and answers when released.
fn slow_then_echo(started: Arc<Notify>, release: Arc<Notify>, calls: Arc<AtomicUsize>) -> Targets {
    let mut targets = Targets::default();
    targets.register(
        "slow",
        Arc::new(FnTarget(move |_call: TargetCall| {
            let (started, release) = (started.clone(), release.clone());
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                started.notify_one();
                release.notified().await;
                Ok::<_, StepFailure>(json!({"done": true}))
            }
        })),
        8,
    );
    targets
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_arriving_while_the_job_runs_leaves_the_segment_alone_and_is_taken_next(
    pool: PgPool,
) {
    let (started, release, calls) = (
        Arc::new(Notify::new()),
        Arc::new(Notify::new()),
        Arc::default(),
    );
    let document = json!({
        "name": "slow-then-wait", "input_schema": {},
        "steps": [
            {"name": "work", "target": "slow", "method": "m"},
            {"name": "paid", "wait_for": "payment-settled"}
        ]
    });
    let targets = slow_then_echo(started.clone(), release.clone(), Arc::clone(&calls));
    let engine = engine_with(&pool, targets, &document).await;
    let job_id = submit(&engine, "slow-then-wait", json!({})).await;
    let running = tokio::spawn({
        let engine = engine.clone();
        async move { engine.run_once().await.unwrap() }
    });
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the slow call never started");

    let receipt = send(&engine, signal(job_id, "mid", json!({"amount": 1}))).await;
    assert!(!receipt.woke_job, "a running job is left alone");
    release.notify_one();
    let outcome = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the segment never ended")
        .unwrap();
    // The segment kept its answer (its fence ignores the signal's event),
    // reached the wait without having seen the signal, and its park found
    // the signal there: queued at once rather than left waiting.
    assert_eq!(outcome, Outcome::Parked(job_id));
    let parked = row(&pool, job_id).await;
    assert_eq!(parked.status, RunStatus::Queued, "woken by its own park");
    assert_eq!(parked.outstanding_step, None);

    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the slow step ran once");
    let sequences: Vec<i64> = events(&pool, job_id)
        .await
        .iter()
        .map(|e| e.sequence())
        .collect();
    let expected: Vec<i64> = (1..=i64::try_from(sequences.len()).unwrap()).collect();
    assert_eq!(sequences, expected, "one stream, no gap, no repeat");
    // The park never left the job WAITING: it says nothing of a wait
    // (review L5: a WAITING event for a job that went QUEUED).
    let types = event_types(&pool, job_id).await;
    assert!(
        !types.contains(&E::Waiting),
        "a woken park wrote a WAITING event: {types:?}"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_repeated_key_gives_the_first_receipt_and_other_content_under_it_is_a_conflict(
    pool: PgPool,
) {
    let engine = engine_with(&pool, echo_targets(&Calls::default()), &payment()).await;
    let job_id = submit(&engine, "payment", json!({})).await;
    let first = send(&engine, signal(job_id, "k", json!({"amount": 5}))).await;
    let again = send(&engine, signal(job_id, "k", json!({"amount": 5}))).await;
    assert!(again.repeat);
    assert_eq!(
        (again.seq, again.received_at),
        (first.seq, first.received_at)
    );

    let conflict = engine
        .send_signal(signal(job_id, "k", json!({"amount": 6})))
        .await
        .unwrap_err();
    assert!(
        matches!(&conflict, SignalError::Conflict { key, .. } if key == "k"),
        "{conflict}"
    );
    assert_eq!(engine.signals(job_id).await.unwrap().len(), 1);
    assert_eq!(
        verdicts(&pool, job_id, E::Accepted).await,
        ["signal 1 received: payment-settled"],
        "one event for the one signal kept"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn signals_nobody_can_take_are_refused_each_with_its_reason(pool: PgPool) {
    let engine = engine_with(&pool, echo_targets(&Calls::default()), &payment()).await;
    let job_id = submit(&engine, "payment", json!({})).await;
    let refused = |signal: Signal| {
        let engine = engine.clone();
        async move { engine.send_signal(signal).await.unwrap_err() }
    };

    let unknown = refused(signal(Uuid::new_v4(), "a", json!({"amount": 1}))).await;
    assert_eq!(unknown.code(), Some("unknown_job"), "{unknown}");
    let mut other = signal(job_id, "b", json!({"amount": 1}));
    other.name = "refund".into();
    let not_awaited = refused(other).await;
    assert_eq!(not_awaited.code(), Some("not_awaited"), "{not_awaited}");
    let misfit = refused(signal(job_id, "c", json!({"no": "amount"}))).await;
    assert_eq!(misfit.code(), Some("payload_misfit"), "{misfit}");
    assert!(misfit.to_string().contains("amount"), "{misfit}");
    let huge = json!({"amount": 1, "pad": "x".repeat(70 * 1024)});
    let oversize = refused(signal(job_id, "d", huge)).await;
    assert!(
        oversize.to_string().contains("payload is"),
        "names the field: {oversize}"
    );
    let nul = refused(signal(job_id, "e\u{0}", json!({"amount": 1}))).await;
    assert_eq!(nul.code(), Some("invalid"), "{nul}");
    assert!(
        engine.signals(job_id).await.unwrap().is_empty(),
        "nothing refused is kept"
    );

    engine.cancel(job_id, "stop").await.unwrap();
    let finished = refused(signal(job_id, "f", json!({"amount": 1}))).await;
    assert!(
        matches!(
            finished,
            SignalError::Finished {
                status: RunStatus::Cancelled,
                ..
            }
        ),
        "{finished}"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_holding_a_hundred_untaken_signals_refuses_the_next(pool: PgPool) {
    let document = json!({
        "name": "many", "input_schema": {},
        "steps": [{"name": "w", "wait_for": "tick"}, {"name": "v", "wait_for": "tick"}]
    });
    let engine = engine_with(&pool, Targets::default(), &document).await;
    let job_id = submit(&engine, "many", json!({})).await;
    let tick = |n: usize| Signal {
        job_id,
        name: "tick".into(),
        payload: json!(n),
        source: Value::Null,
        idempotency_key: format!("t{n}"),
    };
    for n in 0..100 {
        engine.send_signal(tick(n)).await.unwrap();
    }
    let full = engine.send_signal(tick(100)).await.unwrap_err();
    assert_eq!(full.code(), Some("signals_full"), "{full}");

    // Both waits take the oldest two, in order; their room goes to new ones.
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    let done = row(&pool, job_id).await;
    assert_eq!(done.result.unwrap().0, json!(1), "v took the second oldest");
    let cancelled_late = engine.send_signal(tick(100)).await.unwrap_err();
    assert_eq!(cancelled_late.code(), Some("job_finished"));
    let history = engine.signals(job_id).await.unwrap();
    assert_eq!(history.len(), 100);
    assert_eq!(history.last().unwrap().consumed_by.as_deref(), Some("w"));
}

/// Signals kept are bounded in bytes too (review M6): each signal
/// rewrites the row's array, so a flood of large untaken ones would make
/// every next one dearer (measured: 187 ms for the 99th of 60 KiB, 3 ms
/// for a small one). Past a mebibyte the next is refused `signals_full`;
/// taken ones make room as for the count.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_holding_a_mebibyte_of_untaken_signals_refuses_the_next(pool: PgPool) {
    let document = json!({
        "name": "heavy", "input_schema": {},
        "steps": [{"name": "w", "wait_for": "tick"}, {"name": "v", "wait_for": "tock"}]
    });
    let engine = engine_with(&pool, Targets::default(), &document).await;
    let job_id = submit(&engine, "heavy", json!({})).await;
    let pad = "x".repeat(60 * 1024);
    let tick = |n: usize| Signal {
        job_id,
        name: "tick".into(),
        payload: json!({"n": n, "pad": pad}),
        source: Value::Null,
        idempotency_key: format!("t{n}"),
    };
    let mut kept = 0;
    let refused = loop {
        match engine.send_signal(tick(kept)).await {
            Ok(_) => kept += 1,
            Err(e) => break e,
        }
        assert!(kept <= 100, "a hundred signals of 60 KiB were all kept");
    };
    assert_eq!(refused.code(), Some("signals_full"), "{refused}");
    assert_eq!(kept, 17, "a mebibyte holds 17 signals of 60 KiB");
    // `w` takes the oldest; its room goes to the next.
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let tock = Signal {
        name: "tock".into(),
        idempotency_key: "tock".into(),
        ..tick(kept)
    };
    let receipt = engine.send_signal(tock).await.unwrap();
    assert!(receipt.woke_job, "{receipt:?}");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn taken_signals_make_room_for_new_ones(pool: PgPool) {
    let document = json!({
        "name": "room", "input_schema": {},
        "steps": [{"name": "first", "wait_for": "tick"}, {"name": "later", "wait_for": "tock"}]
    });
    let engine = engine_with(&pool, Targets::default(), &document).await;
    let job_id = submit(&engine, "room", json!({})).await;
    let send_one = |name: &str, n: usize| Signal {
        job_id,
        name: name.into(),
        payload: json!(n),
        source: Value::Null,
        idempotency_key: format!("{name}{n}"),
    };
    engine.send_signal(send_one("tick", 0)).await.unwrap();
    for n in 1..100 {
        engine.send_signal(send_one("tick", n)).await.unwrap();
    }
    // `first` takes tick 0 and the job parks on `later`: one kept signal
    // is consumed, so one more fits, dropping the consumed one.
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let receipt = engine.send_signal(send_one("tock", 0)).await.unwrap();
    assert!(receipt.woke_job);
    let history = engine.signals(job_id).await.unwrap();
    assert_eq!(history.len(), 100);
    assert!(
        history.iter().all(|s| s.idempotency_key != "tick0"),
        "the consumed signal made room"
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_payload_its_validate_refuses_fails_the_job_with_the_verdict(pool: PgPool) {
    let engine = engine_with(&pool, echo_targets(&Calls::default()), &payment()).await;
    let job_id = submit(&engine, "payment", json!({})).await;
    send(&engine, signal(job_id, "zero", json!({"amount": 0}))).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Failed(job_id));
    let failed = row(&pool, job_id).await;
    assert!(
        failed
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("amount"),
        "{:?}",
        failed.error
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_wait_whose_when_says_no_is_skipped_without_a_signal(pool: PgPool) {
    let document = json!({
        "name": "maybe", "input_schema": {},
        "steps": [{"name": "w", "wait_for": "go", "when": "input.wait"}]
    });
    let engine = engine_with(&pool, Targets::default(), &document).await;
    let job_id = submit(&engine, "maybe", json!({"wait": false})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    let waits = submit(&engine, "maybe", json!({"wait": true})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(waits));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_wait_calls_no_target_and_its_definition_says_so(pool: PgPool) {
    let engine = engine_with(&pool, echo_targets(&Calls::default()), &payment()).await;
    let refused = engine
        .register_workflow(&json!({
            "name": "bad", "input_schema": {},
            "steps": [{"name": "w", "wait_for": "go", "target": "echo", "method": "m"}]
        }))
        .await
        .unwrap_err();
    let text = refused.to_string();
    assert!(
        text.contains("w") && text.contains("target") && text.contains("wait_for"),
        "{text}"
    );
    let blank = engine
        .register_workflow(&json!({
            "name": "blank", "input_schema": {},
            "steps": [{"name": "w", "wait_for": " "}]
        }))
        .await
        .unwrap_err();
    assert!(blank.to_string().contains("wait_for"), "{blank}");
}

/// A refused signal lets go of the job's row when it returns: a transaction
/// merely dropped would keep the row locked until its connection is used
/// again, and a claim (SKIP LOCKED) would pass the job by meanwhile.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_refused_signal_leaves_the_jobs_row_unlocked(pool: PgPool) {
    let calls = Calls::default();
    let engine = engine_with(&pool, echo_targets(&calls), &payment()).await;
    let job_id = submit(&engine, "payment", json!({})).await;
    let mut other = crate::support::own_connection(&pool).await;
    for n in 0..20 {
        let mut unawaited = signal(job_id, &format!("k{n}"), json!({"amount": 1}));
        unawaited.name = "nobody-waits".into();
        assert!(matches!(
            engine.send_signal(unawaited).await,
            Err(SignalError::NotAwaited { .. })
        ));
        crate::support::assert_unlocked(&mut other, job_id, &format!("refusal {n}")).await;
    }
    sqlx::Connection::close(other).await.unwrap();
}

/// An operator's session holds the job's row (`BEGIN; SELECT … FOR
/// UPDATE`, left open): a signal for it fails within the lock wait with a
/// failure of the world (no dead-letter code: the consumer pauses and
/// tries the batch again) instead of stalling the signal consumer's batch;
/// once the row is let go the same signal wakes the job.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_for_a_row_another_session_holds_fails_within_the_lock_wait_and_is_kept_later(
    pool: PgPool,
) {
    let calls = Calls::default();
    let mut settings = settings("w");
    settings.lease = Duration::from_secs(2);
    let engine = Engine::new(pool.clone(), echo_targets(&calls), manual_clock(), settings);
    engine.register_workflow(&payment()).await.unwrap();
    let job_id = submit(&engine, "payment", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));

    let operator = crate::support::RowHeld::by_another_session(&pool, job_id).await;
    let settled = signal(job_id, "settle-1", json!({"amount": 42}));
    let held = operator
        .fails_within_the_lock_wait(engine.send_signal(settled.clone()))
        .await;
    match &held {
        SignalError::Store(store) => assert!(store.is_a_blocked_row(), "{store:?}"),
        other => panic!("not a failure of the world: {other:?}"),
    }
    assert_eq!(held.code(), None, "retried, never dead-lettered");

    operator.let_go().await;
    assert!(send(&engine, settled).await.woke_job);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
}

/// Sends a signal named `name` to `job_id` under a fresh key.
async fn send_named(engine: &Engine, job_id: Uuid, name: &str) -> SignalReceipt {
    let mut named = signal(job_id, &Uuid::new_v4().to_string(), json!({"amount": 1}));
    name.clone_into(&mut named.name);
    send(engine, named).await
}

/// What a signal must leave alone: the row's status, when it may run and
/// its attempt.
async fn schedule_of(
    pool: &PgPool,
    job_id: Uuid,
) -> (RunStatus, chrono::DateTime<chrono::Utc>, i32) {
    let row = row(pool, job_id).await;
    (row.status, row.run_after, row.attempt)
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_for_a_later_wait_leaves_a_job_backing_off_to_its_backoff(pool: PgPool) {
    let mut targets = Targets::default();
    targets.register(
        "down",
        Arc::new(FnTarget(|_: TargetCall| async {
            Err::<Value, _>(StepFailure::retryable(
                flotilla_worker::targets::RetryClass::Other,
                "503",
            ))
        })),
        8,
    );
    let document = json!({
        "name": "later", "input_schema": {},
        "steps": [{"name": "call", "target": "down", "method": "m"},
                  {"name": "paid", "wait_for": "payment-settled"}]
    });
    let engine = engine_with(&pool, targets, &document).await;
    let job_id = submit(&engine, "later", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Requeued(job_id));
    let backing_off = schedule_of(&pool, job_id).await;
    let receipt = send_named(&engine, job_id, "payment-settled").await;
    assert!(!receipt.woke_job);
    assert_eq!(
        schedule_of(&pool, job_id).await,
        backing_off,
        "the signal cut the job's backoff short"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_for_the_wait_after_a_timer_does_not_wake_the_sleeping_job(pool: PgPool) {
    let document = json!({
        "name": "nap-then-wait", "input_schema": {},
        "steps": [{"name": "nap", "sleep": "24h"},
                  {"name": "paid", "wait_for": "payment-settled"}]
    });
    let engine = engine_with(&pool, echo_targets(&Calls::default()), &document).await;
    let job_id = submit(&engine, "nap-then-wait", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Sleeping(job_id));
    let asleep = schedule_of(&pool, job_id).await;
    let receipt = send_named(&engine, job_id, "payment-settled").await;
    assert!(!receipt.woke_job);
    assert_eq!(
        schedule_of(&pool, job_id).await,
        asleep,
        "woken a day early"
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Idle);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_for_a_wait_not_yet_reached_leaves_a_job_parked_on_another(pool: PgPool) {
    let document = json!({
        "name": "two-waits", "input_schema": {},
        "steps": [{"name": "first", "wait_for": "a"},
                  {"name": "second", "wait_for": "b"}]
    });
    let engine = engine_with(&pool, echo_targets(&Calls::default()), &document).await;
    let job_id = submit(&engine, "two-waits", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let parked = schedule_of(&pool, job_id).await;
    let receipt = send_named(&engine, job_id, "b").await;
    assert!(
        !receipt.woke_job,
        "a signal for the second wait woke the first"
    );
    assert_eq!(schedule_of(&pool, job_id).await, parked);
    // The first wait's signal wakes it; the second's, kept, is then taken.
    assert!(send_named(&engine, job_id, "a").await.woke_job);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_for_a_wait_that_has_its_answer_is_refused_not_kept(pool: PgPool) {
    let document = json!({
        "name": "two-waits", "input_schema": {},
        "steps": [{"name": "first", "wait_for": "a"},
                  {"name": "second", "wait_for": "b"}]
    });
    let engine = engine_with(&pool, echo_targets(&Calls::default()), &document).await;
    let job_id = submit(&engine, "two-waits", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    assert!(send_named(&engine, job_id, "a").await.woke_job);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let mut late = signal(job_id, "late-a", json!({"amount": 1}));
    "a".clone_into(&mut late.name);
    let refused = engine.send_signal(late).await.unwrap_err();
    assert_eq!(refused.code(), Some("not_awaited"), "{refused}");
    assert_eq!(
        engine.signals(job_id).await.unwrap().len(),
        1,
        "a signal nothing will take was kept"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_parked_on_a_human_step_wakes_for_a_signal_a_ready_wait_takes(pool: PgPool) {
    let document = json!({
        "name": "human-and-signal", "input_schema": {},
        "steps": [{"name": "approve", "needs": [], "target": "echo", "method": "m",
                   "completion": "external"},
                  {"name": "paid", "needs": [], "wait_for": "payment-settled"}]
    });
    let engine = engine_with(&pool, echo_targets(&Calls::default()), &document).await;
    let job_id = submit(&engine, "human-and-signal", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    assert_eq!(
        row(&pool, job_id).await.outstanding_step.as_deref(),
        Some("approve")
    );
    assert!(
        send_named(&engine, job_id, "payment-settled")
            .await
            .woke_job,
        "the ready wait's signal waited for the human"
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    let parked = row(&pool, job_id).await;
    assert!(
        parked.has_checkpoint("paid"),
        "the wait did not take its signal"
    );
    assert_eq!(parked.outstanding_step.as_deref(), Some("approve"));
}
