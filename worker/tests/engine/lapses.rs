//! A lapsed lease is not a failure of the work: it spends no attempt, even
//! on the last one, and only a job that loses its worker several times in a
//! row (the one that crashes its worker every time) goes DEAD, saying so.
//! A lapse counts only when its worker is really gone; a failure of the
//! database, or a shutdown whose grace ran out, hands the job back instead.

use std::time::Duration;

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{Clock as _, Engine, ManualClock, Outcome};
use serde_json::json;
use sqlx::PgPool;

use crate::support::{Calls, echo_targets, engine, event_types, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// Claims the job and lets its worker die: the lease lapses and one sweep
/// settles it.
async fn lose_the_worker(engine: &Engine, clock: &ManualClock) {
    drop(engine.claim().await.unwrap().expect("claimable"));
    clock.advance(Duration::from_secs(120));
    assert_eq!(engine.sweep().await.unwrap(), 1);
}

/// Past any lapse's backoff in these tests.
fn past_the_backoff(clock: &ManualClock) {
    clock.advance(Duration::from_secs(60));
}

fn one_attempt(name: &str) -> serde_json::Value {
    json!({"name": name, "input_schema": {}, "max_attempts": 1,
        "steps": [{"name": "only", "target": "echo", "method": "m"}]})
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_lapsed_lease_spends_no_attempt_even_on_the_last_one(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&one_attempt("single"))
        .await
        .unwrap();
    let job_id = submit(&engine, "single", json!({})).await;
    lose_the_worker(&engine, &clock).await;
    let requeued = row(&pool, job_id).await;
    assert_eq!(
        (requeued.status, requeued.attempt),
        (RunStatus::Queued, 0),
        "the attempt was given back"
    );
    past_the_backoff(&clock);
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::Completed(job_id),
        "its one attempt is still there"
    );
    assert_eq!(row(&pool, job_id).await.attempt, 1);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_that_loses_its_worker_three_times_in_a_row_goes_dead_saying_so(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&one_attempt("crashy"))
        .await
        .unwrap();
    let job_id = submit(&engine, "crashy", json!({})).await;
    for _ in 0..3 {
        lose_the_worker(&engine, &clock).await;
        past_the_backoff(&clock);
    }
    let dead = row(&pool, job_id).await;
    assert_eq!(dead.status, RunStatus::Dead);
    let error = dead.error.unwrap();
    assert!(
        error.contains("lost its worker 3 times in a row"),
        "{error}"
    );
    assert_eq!(event_types(&pool, job_id).await, [E::Accepted, E::Dead]);
}

/// The sweeper's DEAD is an end like any other: a job with `on_failure`
/// steps is queued to run them first, then ends DEAD with the lapse's
/// error. A compensation that loses its workers as often ends DEAD
/// without a second round.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_the_sweeper_sends_dead_runs_its_compensation_first(pool: PgPool) {
    let clock = manual_clock();
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), clock.clone(), "w");
    let refunding = |name: &str| {
        let mut workflow = one_attempt(name);
        workflow["on_failure"] = json!([{"name": "refund", "target": "echo", "method": "refund"}]);
        workflow
    };
    for name in ["crashy", "crashier"] {
        engine.register_workflow(&refunding(name)).await.unwrap();
    }
    let job_id = submit(&engine, "crashy", json!({})).await;
    for _ in 0..3 {
        lose_the_worker(&engine, &clock).await;
        past_the_backoff(&clock);
    }
    let headed = row(&pool, job_id).await;
    assert_eq!(headed.status, RunStatus::Queued, "queued to compensate");
    let failure = &headed.compensation.as_ref().expect("compensation begun").0["failure"];
    assert_eq!(failure["dead"], true);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Dead(job_id));
    assert_eq!(
        calls.of(job_id),
        ["refund"],
        "compensated, the step never run"
    );
    let dead = row(&pool, job_id).await;
    assert!(
        dead.error
            .unwrap()
            .contains("lost its worker 3 times in a row"),
        "the lapses are the cause"
    );
    assert_eq!(
        event_types(&pool, job_id).await,
        [E::Accepted, E::StepCheckpoint, E::Dead]
    );

    let doomed = submit(&engine, "crashier", json!({})).await;
    for _ in 0..6 {
        lose_the_worker(&engine, &clock).await;
        past_the_backoff(&clock);
    }
    let dead = row(&pool, doomed).await;
    assert_eq!(
        dead.status,
        RunStatus::Dead,
        "one round of compensation, no more"
    );
    assert!(calls.of(doomed).is_empty());
    assert_eq!(event_types(&pool, doomed).await, [E::Accepted, E::Dead]);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn progress_between_lapses_starts_the_count_again(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&crate::support::three_steps("long", "echo"))
        .await
        .unwrap();
    let job_id = submit(&engine, "long", json!({"n": 1})).await;
    for _ in 0..2 {
        lose_the_worker(&engine, &clock).await;
        past_the_backoff(&clock);
    }
    // A segment that checkpoints is progress: the losses before it no longer count.
    let claimed = engine.claim().await.unwrap().expect("claimable");
    claimed
        .checkpoint(&flotilla_store::runs::Checkpoint {
            name: "one".into(),
            skipped: false,
            response: json!({"step": "one", "request": {"n": 1}}),
            item: None,
            page: None,
            signal: None,
            child: None,
            list: None,
            timed_out: false,
            call: None,
            poll: None,
        })
        .await
        .unwrap();
    drop(claimed);
    for _ in 0..2 {
        clock.advance(Duration::from_secs(120));
        engine.sweep().await.unwrap();
        past_the_backoff(&clock);
        if let Some(claimed) = engine.claim().await.unwrap() {
            drop(claimed);
        }
    }
    assert_ne!(row(&pool, job_id).await.status, RunStatus::Dead);
}

/// A lapse whose worker is gone backs the job off before it can be claimed
/// again, so a job that kills its workers does not take the next one down
/// at once: `backoff_base × 2^(lapses−1)`.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_lapsed_job_is_backed_off_before_it_is_claimed_again(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&one_attempt("lapsing"))
        .await
        .unwrap();
    let job_id = submit(&engine, "lapsing", json!({})).await;
    let base = engine.settings().backoff_base;
    for lapse in 1..=2u32 {
        lose_the_worker(&engine, &clock).await;
        let backoff = base * 2u32.pow(lapse - 1);
        clock.advance(backoff - Duration::from_millis(1));
        assert!(
            engine.claim().await.unwrap().is_none(),
            "lapse {lapse}: still backing off"
        );
        clock.advance(Duration::from_millis(1));
        let requeued = row(&pool, job_id).await;
        assert_eq!(requeued.lease_losses, i32::try_from(lapse).unwrap());
    }
    assert!(
        engine.claim().await.unwrap().is_some(),
        "claimable after its backoff"
    );
}

/// A worker that is alive (its `worker_member` row fresh, started before it
/// last touched the job) but could not renew, as when the database blinked
/// for longer than the lease: the lapse requeues the job without counting,
/// so four such blips in a row never send it DEAD.
#[sqlx::test(migrator = "MIGRATOR")]
async fn lapses_of_a_worker_that_is_still_alive_are_not_counted(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&one_attempt("blinking"))
        .await
        .unwrap();
    let job_id = submit(&engine, "blinking", json!({})).await;
    engine.announce().await.unwrap();
    for _ in 0..4 {
        lose_the_worker(&engine, &clock).await;
        let requeued = row(&pool, job_id).await;
        assert_eq!(
            (requeued.status, requeued.lease_losses, requeued.attempt),
            (RunStatus::Queued, 0, 0)
        );
        assert!(requeued.error.unwrap().contains("is alive"));
        past_the_backoff(&clock);
    }
    // The same worker id, started again after it last touched the job: the
    // process that held it is gone, and that lapse counts.
    drop(engine.claim().await.unwrap().expect("claimable"));
    clock.advance(Duration::from_secs(120));
    let restarted =
        crate::support::engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    restarted.announce().await.unwrap();
    assert_eq!(restarted.sweep().await.unwrap(), 1);
    assert_eq!(row(&pool, job_id).await.lease_losses, 1);
}

/// A store that fails mid-segment (here: commits whose answer is lost, one
/// at each step) is not the job's failure: each time the job is handed back
/// with its attempt unspent and no lapse counted (three in a row would
/// otherwise send it DEAD), backed off twice as long each time, resumes from
/// what is durable, and runs every step once.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_whose_store_fails_mid_segment_is_handed_back_each_time_and_never_dead(pool: PgPool) {
    let clock = manual_clock();
    let calls = Calls::default();
    let engine = engine(&pool, echo_targets(&calls), clock.clone(), "w");
    engine
        .register_workflow(&crate::support::three_steps("blips", "echo"))
        .await
        .unwrap();
    let job_id = submit(&engine, "blips", json!({"n": 1})).await;
    let base = engine.settings().backoff_base;
    for blip in 1..=2u32 {
        engine.commit_faults().fail_after_commit(1);
        assert_eq!(
            engine.run_once().await.unwrap(),
            Outcome::StoreFailed(job_id),
            "blip {blip}"
        );
        let back = row(&pool, job_id).await;
        assert_eq!(
            (back.status, back.attempt, back.lease_losses),
            (RunStatus::Queued, 0, 0),
            "blip {blip}"
        );
        assert!(back.error.unwrap().contains("handed back"), "blip {blip}");
        // Each blip committed a checkpoint (progress), so each hand-back is
        // the first in a row: one base of backoff.
        assert_eq!(back.run_after, clock.now() + base, "blip {blip}");
        clock.advance(base);
    }
    // The last step's checkpoint goes with the completion: the answer to
    // that commit lost too, the job is COMPLETED all the same (the commit
    // happened), and the hand-back that follows finds no lease to give back.
    engine.commit_faults().fail_after_commit(1);
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::StoreFailed(job_id)
    );
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Completed);
    // Three checkpoints and a completion committed across the blips, each once.
    assert_eq!(
        event_types(&pool, job_id).await,
        [
            E::Accepted,
            E::StepCheckpoint,
            E::StepCheckpoint,
            E::StepCheckpoint,
            E::Completed
        ]
    );
    let per_step = calls.per_job_step();
    for step in ["one", "two", "three"] {
        assert_eq!(per_step.get(&(job_id, step.to_owned())), Some(&1), "{step}");
    }
    let done = row(&pool, job_id).await;
    let names: Vec<_> = done
        .checkpoints
        .0
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(names, [json!("one"), json!("two"), json!("three")]);
}

/// A job handed back again and again with no progress between (a store
/// failure its own data keeps causing, classed as an outage) is backed off
/// twice as long each time and, at the tenth in a row, goes DEAD saying
/// so, instead of running its steps again forever.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_handed_back_ten_times_in_a_row_with_no_progress_goes_dead(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&one_attempt("stuck"))
        .await
        .unwrap();
    let job_id = submit(&engine, "stuck", json!({})).await;
    let base = engine.settings().backoff_base;
    // A foreign session holds the job's row whenever it checkpoints: the
    // write fails as a blocked row, a failure of the world, every time.
    sqlx::query(
        "CREATE FUNCTION refuse_writes() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF NEW.event_sequence > OLD.event_sequence THEN
             RAISE EXCEPTION 'held' USING ERRCODE = 'lock_not_available'; END IF;
         RETURN NEW; END $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse_writes BEFORE UPDATE ON workflow_run
         FOR EACH ROW EXECUTE FUNCTION refuse_writes()",
    )
    .execute(&pool)
    .await
    .unwrap();
    for n in 1..flotilla_worker::engine::MAX_HAND_BACKS {
        assert_eq!(
            engine.run_once().await.unwrap(),
            Outcome::StoreFailed(job_id),
            "{n}"
        );
        let back = row(&pool, job_id).await;
        assert_eq!(
            (back.status, back.hand_backs),
            (RunStatus::Queued, n),
            "{n}"
        );
        let backoff = base * 2u32.pow(u32::try_from(n - 1).unwrap()).min(64);
        assert_eq!(
            back.run_after,
            clock.now() + backoff,
            "{n}: backed off twice as long"
        );
        clock.advance(backoff);
    }
    sqlx::query("DROP TRIGGER refuse_writes ON workflow_run")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse_checkpoints BEFORE UPDATE ON workflow_run
         FOR EACH ROW WHEN (NEW.status IN ('RUNNING', 'COMPLETED') AND NEW.event_sequence > OLD.event_sequence)
         EXECUTE FUNCTION refuse_writes()",
    )
    .execute(&pool)
    .await
    .unwrap();
    engine.run_once().await.unwrap();
    let dead = row(&pool, job_id).await;
    assert_eq!(dead.status, RunStatus::Dead);
    assert!(
        dead.error
            .unwrap()
            .contains("handed back 10 times in a row")
    );
    assert_eq!(event_types(&pool, job_id).await, [E::Accepted, E::Dead]);
}

/// A lapse whose owner's row is fresh but which has not announced itself
/// since its lease lapsed is not judged yet: the lease is moved two sweep
/// intervals on. If the owner announces by then it was alive (not
/// counted); if it stays silent it is gone (counted).
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_lapse_waits_for_a_word_from_an_owner_that_was_seen_lately(pool: PgPool) {
    let mut settings = crate::support::settings("sweeper");
    settings.lease = Duration::from_secs(1);
    settings.sweep_interval = Duration::from_millis(200);
    let sweeper = flotilla_worker::engine::Engine::new(
        pool.clone(),
        echo_targets(&Calls::default()),
        std::sync::Arc::new(flotilla_worker::engine::SystemClock),
        settings,
    );
    let lapsed = |owner: &'static str| {
        let pool = pool.clone();
        async move {
            let job_id = uuid::Uuid::new_v4();
            sqlx::query(
                "INSERT INTO worker_member (worker_id, claim_loops, started_at, last_seen)
                 VALUES ($1, 1, now() - interval '1 minute', now() - interval '300 milliseconds')",
            )
            .bind(owner)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest,
                     status, attempt, max_attempts, lease_owner, lease_token, lease_until, updated_at)
                 VALUES ($1, 'w', '{}', '{}', 'd', 'RUNNING', 1, 3, $2, gen_random_uuid(),
                     now() - interval '100 milliseconds', now() - interval '2 seconds')",
            )
            .bind(job_id)
            .bind(owner)
            .execute(&pool)
            .await
            .unwrap();
            job_id
        }
    };
    let alive = lapsed("alive").await;
    let gone = lapsed("gone").await;
    assert_eq!(sweeper.sweep().await.unwrap(), 0, "neither is judged yet");
    for job in [alive, gone] {
        let waiting = row(&pool, job).await;
        assert_eq!(waiting.status, RunStatus::Running);
        assert!(
            waiting.lease_until.unwrap() > chrono::Utc::now(),
            "moved on"
        );
    }
    // The live owner announces itself every sweep interval, as the sweeper
    // of a live worker does; the other has stopped.
    let announcing = tokio::spawn({
        let pool = pool.clone();
        async move {
            loop {
                sqlx::query(
                    "UPDATE worker_member SET last_seen = clock_timestamp() WHERE worker_id = 'alive'",
                )
                .execute(&pool)
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    crate::support::eventually(Duration::from_secs(10), "both settled", || async {
        sweeper.sweep().await.unwrap();
        row(&pool, alive).await.status == RunStatus::Queued
            && row(&pool, gone).await.status == RunStatus::Queued
    })
    .await;
    announcing.abort();
    assert_eq!(
        row(&pool, alive).await.lease_losses,
        0,
        "it announced itself: alive"
    );
    assert_eq!(
        row(&pool, gone).await.lease_losses,
        1,
        "silent past staleness: gone"
    );
}

/// Operator retry gives a job that died of lapses a fresh count.
#[sqlx::test(migrator = "MIGRATOR")]
async fn operator_retry_resets_the_lapse_count(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&one_attempt("retried"))
        .await
        .unwrap();
    let job_id = submit(&engine, "retried", json!({})).await;
    for _ in 0..3 {
        lose_the_worker(&engine, &clock).await;
        past_the_backoff(&clock);
    }
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Dead);
    engine.retry(job_id).await.unwrap();
    assert_eq!(row(&pool, job_id).await.lease_losses, 0);
    lose_the_worker(&engine, &clock).await;
    let once = row(&pool, job_id).await;
    assert_eq!((once.status, once.lease_losses), (RunStatus::Queued, 1));
}

/// Segments still running when the shutdown grace runs out are handed back
/// in one go, fenced on their tokens: QUEUED at once, attempt unspent, no
/// lapse counted, instead of waiting out their leases as losses.
#[sqlx::test(migrator = "MIGRATOR")]
async fn jobs_still_running_at_the_end_of_the_shutdown_grace_are_handed_back_unspent(pool: PgPool) {
    let mut targets = flotilla_worker::targets::Targets::default();
    targets.register(
        "stuck",
        std::sync::Arc::new(flotilla_worker::targets::FnTarget(|_call| async {
            std::future::pending::<Result<serde_json::Value, flotilla_worker::targets::StepFailure>>(
            )
            .await
        })),
        8,
    );
    let mut settings = crate::support::settings("stopping");
    settings.claim_loops = 3;
    let engine = flotilla_worker::engine::Engine::new(
        pool.clone(),
        targets,
        std::sync::Arc::new(flotilla_worker::engine::SystemClock),
        settings,
    );
    engine
        .register_workflow(
            &json!({"name": "stuck", "input_schema": {}, "deadline_ms": 600_000,
            "steps": [{"name": "wait", "target": "stuck", "method": "m"}]}),
        )
        .await
        .unwrap();
    let mut jobs = Vec::new();
    for _ in 0..3 {
        jobs.push(submit(&engine, "stuck", json!({})).await);
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    let runner = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown, Duration::from_millis(300)).await }
    });
    crate::support::eventually(Duration::from_secs(30), "3 jobs RUNNING", || async {
        let running: i64 =
            sqlx::query_scalar("SELECT count(*) FROM workflow_run WHERE status = 'RUNNING'")
                .fetch_one(&pool)
                .await
                .unwrap();
        running == 3
    })
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), runner)
        .await
        .unwrap()
        .unwrap();
    for job_id in jobs {
        let back = row(&pool, job_id).await;
        assert_eq!(
            (back.status, back.attempt, back.lease_losses),
            (RunStatus::Queued, 0, 0)
        );
        assert!(back.lease_token.is_none());
        assert!(back.error.unwrap().contains("shutdown grace"));
    }
}
