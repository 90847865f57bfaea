//! Concurrency keys: at most `limit` jobs of one key hold a slot at once,
//! fleet-wide, from their first step until they end (waits included);
//! what arrives past the limit waits its turn, or cancels the newest or
//! the oldest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_store::RunStatus;
use flotilla_store::runs::concurrency::HELD;
use flotilla_worker::engine::{Engine, ManualClock, Outcome, RefusalMode, Submitted, SystemClock};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{engine, manual_clock, row, stored};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// `per_customer`: `begin` (a call), `approve` (external: the job WAITS
/// holding its slot), `end` (a call); at most `limit` jobs per customer.
fn per_customer(limit: u32, on_excess: &str) -> Value {
    json!({
        "name": "per_customer", "input_schema": {},
        "concurrency": {"key": "input.customer", "limit": limit, "on_excess": on_excess},
        "steps": [
            {"name": "begin", "target": "books", "method": "begin", "rules": ["customer = input.customer"]},
            {"name": "approve", "target": "books", "method": "approve", "completion": "external"},
            {"name": "end", "target": "books", "method": "end", "rules": ["customer = input.customer"]}
        ]
    })
}

/// What the target saw: each customer's jobs between `begin` and `end`,
/// the most at once per customer and overall, and the order of `begin`s.
#[derive(Debug, Default)]
struct Books {
    open: HashMap<String, usize>,
    most_per_customer: HashMap<String, usize>,
    most_overall: usize,
    begun: Vec<String>,
}

fn books_targets(books: &Arc<Mutex<Books>>) -> Targets {
    let books = books.clone();
    let mut targets = Targets::default();
    targets.register(
        "books",
        Arc::new(FnTarget(move |call: TargetCall| {
            let books = books.clone();
            async move {
                let customer = call.request["customer"].as_str().unwrap_or("").to_owned();
                {
                    let mut books = books.lock().unwrap();
                    match call.method.as_str() {
                        "begin" => {
                            let open = books.open.entry(customer.clone()).or_default();
                            *open += 1;
                            let open = *open;
                            let most = books.most_per_customer.entry(customer.clone()).or_default();
                            *most = (*most).max(open);
                            books.most_overall =
                                books.most_overall.max(books.open.values().sum::<usize>());
                            books.begun.push(customer);
                        }
                        "end" => *books.open.entry(customer).or_default() -= 1,
                        _ => {}
                    }
                }
                // Long enough for the other worker's segments to overlap.
                tokio::time::sleep(Duration::from_millis(3)).await;
                Ok::<_, StepFailure>(json!({}))
            }
        })),
        16,
    );
    targets
}

/// Submits `input` to `workflow` a millisecond after the last submission.
async fn submit_later(worker: &Engine, clock: &ManualClock, workflow: &str, input: Value) -> Uuid {
    clock.advance(Duration::from_millis(1));
    let submission = stored(Uuid::new_v4(), workflow, input);
    let job_id = submission.job_id;
    worker
        .submit(submission, RefusalMode::Refuse)
        .await
        .unwrap();
    job_id
}

/// Runs `worker` until every job of `jobs` has ended, completing each
/// `approve` step as its job parks.
async fn drain(worker: Engine, pool: PgPool, jobs: Vec<Uuid>) {
    loop {
        match worker.run_once().await.unwrap() {
            Outcome::Idle => {
                let open: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM workflow_run
                     WHERE job_id = ANY($1) AND status NOT IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')",
                )
                .bind(&jobs)
                .fetch_one(&pool)
                .await
                .unwrap();
                if open == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Outcome::Parked(job_id) => {
                worker
                    .complete_step(job_id, "approve", json!({}))
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
}

/// 50 jobs over 5 keys with limit 1, submitted key by key, drained by two
/// workers: no two jobs of one customer are ever between `begin` and
/// `end` (RUNNING or WAITING) at once, while jobs of different customers
/// are; and the keys are served fairly: by the time half the jobs have
/// begun, every customer has had at least three (a queue served in
/// arrival order would not have started the last customer's yet).
#[sqlx::test(migrator = "MIGRATOR")]
async fn fifty_jobs_over_five_keys_with_limit_one_never_run_two_of_a_key_at_once(pool: PgPool) {
    let books = Arc::new(Mutex::new(Books::default()));
    // The clock of the world: a woken job queues behind the jobs that
    // arrived before its wake, as it would in a fleet.
    let workers = [
        engine(&pool, books_targets(&books), Arc::new(SystemClock), "w1"),
        engine(&pool, books_targets(&books), Arc::new(SystemClock), "w2"),
    ];
    workers[0]
        .register_workflow(&per_customer(1, "queue"))
        .await
        .unwrap();
    let customers = ["ada", "grace", "linus", "margaret", "ken"];
    let mut jobs = Vec::new();
    for customer in customers {
        for _ in 0..10 {
            let submission = stored(
                Uuid::new_v4(),
                "per_customer",
                json!({"customer": customer}),
            );
            jobs.push(submission.job_id);
            workers[0]
                .submit(submission, RefusalMode::Refuse)
                .await
                .unwrap();
        }
    }
    let drains: Vec<_> = workers
        .iter()
        .map(|worker| tokio::spawn(drain(worker.clone(), pool.clone(), jobs.clone())))
        .collect();
    for drain in drains {
        tokio::time::timeout(Duration::from_secs(60), drain)
            .await
            .expect("the jobs ended in time")
            .unwrap();
    }
    for job in &jobs {
        let run = row(&pool, *job).await;
        assert_eq!(run.status, RunStatus::Completed, "{job}: {:?}", run.error);
    }
    let books = books.lock().unwrap();
    assert_eq!(books.begun.len(), 50, "each job began once");
    for customer in customers {
        assert_eq!(
            books.most_per_customer[customer], 1,
            "{customer} never had two jobs open at once"
        );
    }
    assert!(
        books.most_overall > 1,
        "jobs of different customers ran at once: {}",
        books.most_overall
    );
    let half = &books.begun[..25];
    for customer in customers {
        let served = half.iter().filter(|c| c.as_str() == customer).count();
        assert!(
            served >= 3,
            "{customer} had {served} of the first 25 begins: {half:?}"
        );
    }
}

/// A job past its key's limit goes back to the queue without spending an
/// attempt, saying why; the holder's end wakes it at once; a holder
/// cancelled while it waits (no worker sees it end) frees its slot for the
/// sweep to wake the next.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_past_the_limit_is_held_saying_why_and_woken_when_a_slot_frees(pool: PgPool) {
    let books = Arc::new(Mutex::new(Books::default()));
    let clock = manual_clock();
    let worker = engine(&pool, books_targets(&books), clock.clone(), "w");
    worker
        .register_workflow(&per_customer(1, "queue"))
        .await
        .unwrap();
    // A millisecond apart: slots go in order of arrival.
    let submit = async |n: u32| {
        let input = json!({"customer": "ada", "n": n});
        submit_later(&worker, &clock, "per_customer", input).await
    };
    let (first, second, third) = (submit(1).await, submit(2).await, submit(3).await);
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Parked(first));
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Held(second));
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Held(third));
    assert_eq!(
        worker.run_once().await.unwrap(),
        Outcome::Idle,
        "held jobs sleep"
    );
    for job in [second, third] {
        let waiting = row(&pool, job).await;
        assert_eq!(waiting.status, RunStatus::Queued);
        assert_eq!(waiting.attempt, 0, "a hold spends no attempt");
        assert!(!waiting.holds_slot);
        let error = waiting.error.unwrap();
        assert!(
            error.starts_with(&format!("{HELD} per_customer/ada: 1 of 1 slots taken")),
            "{error}"
        );
    }
    assert!(row(&pool, first).await.holds_slot);

    // The holder ends: the older of the two waiting is woken, not both.
    worker
        .complete_step(first, "approve", json!({}))
        .await
        .unwrap();
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Completed(first));
    let (older, younger) = {
        let (a, b) = (row(&pool, second).await, row(&pool, third).await);
        if (a.created_at, a.job_id) < (b.created_at, b.job_id) {
            (second, third)
        } else {
            (third, second)
        }
    };
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Parked(older));
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Idle);
    let parked = row(&pool, older).await;
    assert!(parked.holds_slot);
    assert_eq!(parked.error, None, "the hold's reason is gone with it");

    // Cancelled while it waits: nothing ran to wake the next; the sweep does.
    worker.cancel(older, "not needed").await.unwrap();
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Idle);
    assert_eq!(worker.wake_held().await.unwrap(), 1);
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Parked(younger));
    assert_eq!(worker.wake_held().await.unwrap(), 0, "no slot is free");
}

/// `cancel_newest` cancels an arrival past the limit at once, its answer
/// saying so; `cancel_oldest` cancels the oldest job of the key instead
/// (a waiting one at once), and the arrival takes its place.
#[sqlx::test(migrator = "MIGRATOR")]
async fn past_the_limit_cancel_newest_and_cancel_oldest_cancel_whom_they_say(pool: PgPool) {
    let books = Arc::new(Mutex::new(Books::default()));
    let worker = engine(&pool, books_targets(&books), manual_clock(), "w");
    let mut newest = per_customer(1, "cancel_newest");
    newest["name"] = json!("newest");
    let mut oldest = per_customer(1, "cancel_oldest");
    oldest["name"] = json!("oldest");
    worker.register_workflow(&newest).await.unwrap();
    worker.register_workflow(&oldest).await.unwrap();
    let submit = async |workflow: &str, customer: &str| {
        let submission = stored(Uuid::new_v4(), workflow, json!({"customer": customer}));
        worker
            .submit(submission, RefusalMode::Refuse)
            .await
            .unwrap()
    };

    let kept = submit("newest", "ada").await.row().unwrap().job_id;
    let Submitted::Created(refused) = submit("newest", "ada").await else {
        panic!("a new job")
    };
    assert_eq!(refused.status, RunStatus::Cancelled, "the answer says so");
    let error = refused.error.unwrap();
    assert!(
        error.contains("concurrency key newest/ada") && error.contains("cancel_newest"),
        "{error}"
    );
    assert_eq!(row(&pool, kept).await.status, RunStatus::Queued);
    // In one batch the first of a key is the one kept.
    let batch: Vec<_> = (0..3)
        .map(|_| stored(Uuid::new_v4(), "newest", json!({"customer": "linus"})))
        .collect();
    let ids: Vec<Uuid> = batch.iter().map(|s| s.job_id).collect();
    let answers = worker.submit_batch(batch).await.unwrap();
    let statuses: Vec<RunStatus> = answers
        .iter()
        .map(|answer| answer.as_ref().unwrap().row().unwrap().status)
        .collect();
    assert_eq!(
        statuses,
        [
            RunStatus::Queued,
            RunStatus::Cancelled,
            RunStatus::Cancelled
        ],
        "{ids:?}"
    );
    let other = submit("newest", "grace").await.row().unwrap().job_id;
    assert_eq!(
        row(&pool, other).await.status,
        RunStatus::Queued,
        "another key"
    );

    let first = submit("oldest", "ada").await.row().unwrap().job_id;
    // Run everything runnable: `kept`, `other` and `first` park.
    while worker.run_once().await.unwrap() != Outcome::Idle {}
    assert_eq!(row(&pool, first).await.status, RunStatus::Waiting);
    let second = submit("oldest", "ada").await;
    assert_eq!(second.row().unwrap().status, RunStatus::Queued);
    let cancelled = row(&pool, first).await;
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    assert!(
        cancelled.error.unwrap().contains("cancel_oldest"),
        "the oldest gave way"
    );
    let second = second.row().unwrap().job_id;
    assert_eq!(worker.wake_held().await.unwrap(), 0, "nobody was held");
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Parked(second));
}

/// A key that is not a string or a number refuses the input; a limit out
/// of bounds refuses the definition.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_bad_key_refuses_the_input_and_a_bad_limit_the_definition(pool: PgPool) {
    let books = Arc::new(Mutex::new(Books::default()));
    let worker = engine(&pool, books_targets(&books), manual_clock(), "w");
    let refused = worker.register_workflow(&per_customer(0, "queue")).await;
    assert!(
        format!("{refused:?}").contains("concurrency.limit"),
        "{refused:?}"
    );
    worker
        .register_workflow(&per_customer(2, "queue"))
        .await
        .unwrap();
    let refused = worker
        .submit(
            stored(Uuid::new_v4(), "per_customer", json!({"customer": [1]})),
            RefusalMode::Refuse,
        )
        .await;
    assert!(
        format!("{refused:?}").contains("concurrency.key: gave [1]"),
        "{refused:?}"
    );
}

/// A held job past its execution timeout is ended, not held again; a move
/// to a version with a concurrency key gives the job that version's key.
#[sqlx::test(migrator = "MIGRATOR")]
async fn an_expired_held_job_ends_and_a_moved_job_takes_its_version_s_key(pool: PgPool) {
    let books = Arc::new(Mutex::new(Books::default()));
    let clock = manual_clock();
    let worker = engine(&pool, books_targets(&books), clock.clone(), "w");
    let mut expiring = per_customer(1, "queue");
    expiring["execution_timeout_ms"] = json!(60_000);
    worker.register_workflow(&expiring).await.unwrap();
    let submit = async |input: Value| submit_later(&worker, &clock, "per_customer", input).await;
    let (holder, waiter) = (
        submit(json!({"customer": "ada"})).await,
        submit(json!({"customer": "ada"})).await,
    );
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Parked(holder));
    assert_eq!(worker.run_once().await.unwrap(), Outcome::Held(waiter));
    clock.advance(Duration::from_secs(61));
    worker.wake_due_waits().await.unwrap();
    let mut ended = Vec::new();
    while let Ok(outcome) = worker.run_once().await {
        if outcome == Outcome::Idle {
            break;
        }
        ended.push(outcome);
    }
    assert!(ended.contains(&Outcome::Failed(waiter)), "{ended:?}");
    let error = row(&pool, waiter).await.error.unwrap();
    assert!(error.starts_with("timed out"), "{error}");

    // A workflow without a key, then a version with one.
    let mut plain = per_customer(1, "queue");
    plain["name"] = json!("moving");
    plain.as_object_mut().unwrap().remove("concurrency");
    worker.register_workflow(&plain).await.unwrap();
    let moving = stored(Uuid::new_v4(), "moving", json!({"customer": "grace"}));
    let moving_id = moving.job_id;
    worker.submit(moving, RefusalMode::Refuse).await.unwrap();
    worker.cancel(moving_id, "to move it").await.unwrap();
    assert_eq!(row(&pool, moving_id).await.concurrency_key, None);
    let mut keyed = per_customer(1, "queue");
    keyed["name"] = json!("moving");
    worker.register_workflow(&keyed).await.unwrap();
    worker.retry_onto(moving_id, None).await.unwrap();
    let moved = row(&pool, moving_id).await;
    assert_eq!(
        (moved.concurrency_key.as_deref(), moved.concurrency_limit),
        (Some("moving/grace"), Some(1))
    );
}
