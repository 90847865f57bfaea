//! Eager start: a job submitted while a claim loop of the same worker waits
//! is written already claimed by that worker and run at once, never more
//! than the loops waiting, and never a job whose start a rule holds back.

use std::sync::Arc;
use std::time::Duration;

use flotilla_store::RunStatus;
use flotilla_worker::engine::{Engine, EngineSettings, RefusalMode, Submitted, SystemClock};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{
    Calls, echo_engine, echo_targets, eventually, row, run_in_background, settings, stored,
    three_steps,
};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// An engine of `loops` claim loops that poll once an hour and hear no
/// other process, so nothing but its own submissions starts work on it.
async fn quiet_engine(pool: &PgPool, calls: &Calls, loops: usize, eager: bool) -> Engine {
    let mut quiet: EngineSettings = settings("eager");
    quiet.claim_loops = loops;
    quiet.idle_poll_min = Duration::from_secs(3600);
    quiet.idle_poll_max = Duration::from_secs(3600);
    quiet.listen_for_work = false;
    quiet.eager_start = eager;
    echo_engine(pool, calls, Arc::new(SystemClock), quiet, "eager").await
}

/// Runs `engine`'s loops until the returned token is cancelled, once every
/// loop has looked for work and waits.
async fn start(engine: &Engine, loops: usize) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let (stop, running) = run_in_background(engine);
    eventually(Duration::from_secs(10), "every loop waits", || async {
        engine.free_seats() == loops
    })
    .await;
    (stop, running)
}

fn created(submitted: &Submitted) -> &flotilla_store::runs::RunRow {
    match submitted {
        Submitted::Created(row) => row,
        other => panic!("not created: {other:?}"),
    }
}

async fn completed(pool: &PgPool, job_id: Uuid) {
    eventually(Duration::from_secs(10), "the job completed", || async {
        row(pool, job_id).await.status == RunStatus::Completed
    })
    .await;
}

/// The row commits RUNNING under this worker's lease with its first attempt
/// counted (no QUEUED row, no claim), and the job runs to the end, each
/// step called once; with eager start off the same submission is QUEUED.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_submitted_to_a_waiting_loop_is_written_claimed_and_runs_at_once(pool: PgPool) {
    for eager in [true, false] {
        let calls = Calls::default();
        let engine = quiet_engine(&pool, &calls, 1, eager).await;
        let (stop, running) = start(&engine, usize::from(eager)).await;
        let job_id = Uuid::new_v4();
        let submitted = engine
            .submit(
                stored(job_id, "eager", json!({"n": 1})),
                RefusalMode::Refuse,
            )
            .await
            .unwrap();
        let written = created(&submitted);
        if eager {
            assert_eq!(written.status, RunStatus::Running);
            assert_eq!(written.lease_owner.as_deref(), Some("eager"));
            assert!(written.lease_token.is_some() && written.attempt == 1);
        } else {
            assert_eq!(written.status, RunStatus::Queued);
        }
        completed(&pool, job_id).await;
        assert_eq!(calls.of(job_id).len(), 3, "eager={eager}");
        assert_eq!(row(&pool, job_id).await.attempt, 1);
        stop.cancel();
        running.await.unwrap();
    }
}

/// A batch from the request topic takes no more seats than loops wait: two
/// loops, ten requests, two written claimed and eight QUEUED, and every job
/// runs once to the end.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_batch_takes_no_more_jobs_than_loops_wait(pool: PgPool) {
    let calls = Calls::default();
    let engine = quiet_engine(&pool, &calls, 2, true).await;
    let (stop, running) = start(&engine, 2).await;
    let jobs: Vec<Uuid> = (0..10).map(|_| Uuid::new_v4()).collect();
    let results = engine
        .submit_batch(
            jobs.iter()
                .map(|id| stored(*id, "eager", json!({"n": 1})))
                .collect(),
        )
        .await
        .unwrap();
    let statuses: Vec<RunStatus> = results
        .iter()
        .map(|result| created(result.as_ref().unwrap()).status)
        .collect();
    let claimed = statuses
        .iter()
        .filter(|s| **s == RunStatus::Running)
        .count();
    assert_eq!(claimed, 2, "{statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| **s == RunStatus::Queued).count(),
        8
    );
    for job_id in &jobs {
        completed(&pool, *job_id).await;
        assert_eq!(calls.of(*job_id).len(), 3);
    }
    stop.cancel();
    running.await.unwrap();
}

/// A repeat of a job, a refusal recorded as FAILED, a job of a concurrency
/// key or a debounce window, and one calling a target this worker lacks
/// are written as without eager start (the repeat not at all), and each
/// gives its seat back.
#[sqlx::test(migrator = "MIGRATOR")]
async fn jobs_a_rule_holds_back_are_queued_and_give_their_seat_back(pool: PgPool) {
    let calls = Calls::default();
    let engine = quiet_engine(&pool, &calls, 1, true).await;
    let mut keyed = three_steps("keyed", "echo");
    keyed["concurrency"] = json!({"key": "input.customer", "limit": 1});
    let mut debounced = three_steps("debounced", "echo");
    debounced["debounce"] = json!({"key": "input.customer", "window_ms": 3_600_000});
    for document in [&keyed, &debounced] {
        engine.register_workflow(document).await.unwrap();
    }
    // Registered by a worker that has the target `elsewhere`; this one has not.
    let mut elsewhere = flotilla_worker::targets::Targets::default();
    elsewhere.register(
        "elsewhere",
        Arc::new(flotilla_worker::targets::FnTarget(
            |_: flotilla_worker::targets::TargetCall| async {
                Ok::<_, flotilla_worker::targets::StepFailure>(json!({}))
            },
        )),
        1,
    );
    Engine::new(
        pool.clone(),
        elsewhere,
        Arc::new(SystemClock),
        settings("other"),
    )
    .register_workflow(&three_steps("remote", "elsewhere"))
    .await
    .unwrap();
    let (stop, running) = start(&engine, 1).await;

    let first = Uuid::new_v4();
    let submit = |job_id, workflow: &'static str, mode| {
        let engine = engine.clone();
        async move {
            engine
                .submit(
                    stored(job_id, workflow, json!({"n": 1, "customer": "ada"})),
                    mode,
                )
                .await
                .unwrap()
        }
    };
    assert_eq!(
        created(&submit(first, "eager", RefusalMode::Refuse).await).status,
        RunStatus::Running
    );
    completed(&pool, first).await;
    eventually(Duration::from_secs(10), "the loop waits again", || async {
        engine.free_seats() == 1
    })
    .await;
    assert!(matches!(
        submit(first, "eager", RefusalMode::Refuse).await,
        Submitted::Existing(_)
    ));
    assert_eq!(engine.free_seats(), 1, "the repeat gave its seat back");
    let refused = submit(Uuid::new_v4(), "no-such-workflow", RefusalMode::Record).await;
    assert_eq!(created(&refused).status, RunStatus::Failed);
    assert_eq!(engine.free_seats(), 1, "the refusal gave its seat back");
    for workflow in ["keyed", "debounced", "remote"] {
        let held = submit(Uuid::new_v4(), workflow, RefusalMode::Refuse).await;
        assert_eq!(created(&held).status, RunStatus::Queued, "{workflow}");
        assert!(created(&held).lease_owner.is_none(), "{workflow}");
    }
    stop.cancel();
    running.await.unwrap();
}

/// A job written claimed by a worker that dies before running it is not
/// lost: its lease lapses, the sweeper of another worker requeues it, and
/// that worker runs it, each step once.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_written_claimed_by_a_worker_that_died_runs_elsewhere_after_its_lease(pool: PgPool) {
    let calls = Calls::default();
    let mut short = settings("doomed");
    short.lease = Duration::from_millis(600);
    let doomed = echo_engine(&pool, &calls, Arc::new(SystemClock), short, "eager").await;
    doomed.offer_a_seat_nobody_fills();
    let job_id = Uuid::new_v4();
    let submitted = doomed
        .submit(
            stored(job_id, "eager", json!({"n": 1})),
            RefusalMode::Refuse,
        )
        .await
        .unwrap();
    assert_eq!(created(&submitted).status, RunStatus::Running);
    drop(doomed);

    let survivor = Engine::new(
        pool.clone(),
        echo_targets(&calls),
        Arc::new(SystemClock),
        settings("survivor"),
    );
    let (stop, running) = run_in_background(&survivor);
    completed(&pool, job_id).await;
    assert_eq!(calls.of(job_id).len(), 3);
    let finished = row(&pool, job_id).await;
    assert_eq!(finished.attempt, 1, "the lapse gave the attempt back");
    assert!(finished.lease_owner.is_none());
    stop.cancel();
    running.await.unwrap();
}

/// A job written claimed for a loop that stops before taking it goes back
/// to the queue when its engine stops, its attempt given back, not at the
/// lapse of its lease.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_handed_to_a_stopping_engine_is_handed_back_to_the_queue(pool: PgPool) {
    let calls = Calls::default();
    let engine = quiet_engine(&pool, &calls, 0, true).await;
    let (stop, running) = run_in_background(&engine);
    engine.offer_a_seat_nobody_fills();
    let job_id = Uuid::new_v4();
    let submitted = engine
        .submit(
            stored(job_id, "eager", json!({"n": 1})),
            RefusalMode::Refuse,
        )
        .await
        .unwrap();
    assert_eq!(created(&submitted).status, RunStatus::Running);
    stop.cancel();
    running.await.unwrap();
    let back = row(&pool, job_id).await;
    assert_eq!(back.status, RunStatus::Queued);
    assert_eq!((back.attempt, back.lease_owner), (0, None));
    assert!(calls.of(job_id).is_empty());
}

/// A job handed over already claimed that waited for a loop until less than
/// half its lease was left is handed back to the queue and claimed afresh,
/// not run on the lease it was written with.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_that_waited_half_its_lease_for_a_loop_is_claimed_afresh(pool: PgPool) {
    let calls = Calls::default();
    let clock = crate::support::manual_clock();
    let engine = echo_engine(&pool, &calls, clock.clone(), settings("slow"), "eager").await;
    engine.offer_a_seat_nobody_fills();
    let job_id = Uuid::new_v4();
    let submitted = engine
        .submit(
            stored(job_id, "eager", json!({"n": 1})),
            RefusalMode::Refuse,
        )
        .await
        .unwrap();
    let written_token = created(&submitted).lease_token;
    assert!(written_token.is_some());
    clock.advance(settings("slow").lease / 2 + Duration::from_secs(1));

    let claims = engine.claim_statements();
    let outcome = engine.run_once().await.unwrap();
    assert_eq!(outcome, flotilla_worker::engine::Outcome::Completed(job_id));
    assert_eq!(engine.claim_statements(), claims + 1, "claimed afresh");
    let finished = row(&pool, job_id).await;
    assert_eq!(
        (finished.status, finished.attempt),
        (RunStatus::Completed, 1)
    );
    assert_eq!(calls.of(job_id).len(), 3);
}
