//! Schedules: each tick starts exactly one job across the fleet, whatever
//! the number of workers looking; ticks missed while no worker could start
//! them follow the schedule's policy; paused schedules start nothing.

use std::sync::Arc;
use std::time::Duration;

use flotilla_store::ManualClock;
use flotilla_worker::engine::Engine;
use flotilla_worker::engine::ops::schedules::{Put, ScheduleError, ScheduleSpec, tick_job_id};
use serde_json::json;
use sqlx::PgPool;

use crate::support::{Calls, echo_targets, manual_clock, rows, settings, three_steps};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// `workers` engines over one database and one clock, the `counter`
/// workflow stored.
async fn fleet(pool: &PgPool, workers: usize) -> (Vec<Engine>, Arc<ManualClock>) {
    let clock = manual_clock();
    let engines: Vec<Engine> = (0..workers)
        .map(|n| {
            Engine::new(
                pool.clone(),
                echo_targets(&Calls::default()),
                clock.clone(),
                settings(&format!("w{n}")),
            )
        })
        .collect();
    engines[0]
        .register_workflow(&three_steps("counter", "echo"))
        .await
        .unwrap();
    (engines, clock)
}

fn every(name: &str, interval: &str, missed: &str) -> ScheduleSpec {
    ScheduleSpec {
        name: name.into(),
        workflow_name: "counter".into(),
        input: json!({"n": 1}),
        cron: None,
        time_zone: None,
        interval: Some(interval.into()),
        missed: Some(missed.into()),
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_schedule_ticking_with_three_workers_starts_one_job_per_tick(pool: PgPool) {
    let (engines, clock) = fleet(&pool, 3).await;
    let (put, schedule) = engines[0]
        .put_schedule(&every("tick", "10s", "skip"))
        .await
        .unwrap();
    assert_eq!(put, Put::Created);
    let mut ticks = Vec::new();
    for _ in 0..5 {
        clock.advance(Duration::from_secs(10));
        ticks.push(engines[0].schedule("tick").await.unwrap().next_run_at);
        // The three workers look at once.
        let passes =
            futures_util::future::join_all(engines.iter().map(Engine::run_schedules)).await;
        let started: usize = passes.into_iter().map(|p| p.unwrap().len()).sum();
        assert_eq!(started, 1, "one job for the tick, whoever started it");
    }
    assert_eq!(rows(&pool).await, 5);
    let after = engines[0].schedule("tick").await.unwrap();
    assert_eq!(after.next_run_at, ticks[4] + chrono::TimeDelta::seconds(10));
    let schedule_id: uuid::Uuid = sqlx::query_scalar("SELECT schedule_id FROM workflow_schedule")
        .fetch_one(&pool)
        .await
        .unwrap();
    for tick in &ticks {
        let job = engines[0]
            .job(tick_job_id(schedule_id, *tick))
            .await
            .unwrap();
        assert!(job.is_some(), "the tick at {tick} has its derived job");
    }
    assert_eq!(after.last_job_id, Some(tick_job_id(schedule_id, ticks[4])));
    assert!(!schedule.paused);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn ticks_missed_while_no_worker_ran_are_skipped_or_run_once_as_the_schedule_says(
    pool: PgPool,
) {
    let (engines, clock) = fleet(&pool, 1).await;
    let engine = &engines[0];
    engine
        .put_schedule(&every("skips", "10m", "skip"))
        .await
        .unwrap();
    engine
        .put_schedule(&every("catches-up", "10m", "run_once"))
        .await
        .unwrap();
    // Every worker was down for 48 minutes: four ticks came, the latest
    // 8 minutes ago.
    clock.advance(Duration::from_secs(48 * 60));
    let started = engine.run_schedules().await.unwrap();
    assert_eq!(started.len(), 1, "run_once starts one job, skip none");
    let caught_up = engine.schedule("catches-up").await.unwrap();
    assert_eq!(caught_up.last_job_id, Some(started[0]));
    let skipped = engine.schedule("skips").await.unwrap();
    assert_eq!(skipped.last_job_id, None);
    let now = flotilla_store::Clock::now(&*clock);
    for schedule in [caught_up, skipped] {
        assert!(
            schedule.next_run_at > now
                && schedule.next_run_at <= now + chrono::TimeDelta::minutes(10),
            "both go on from the next tick: {}",
            schedule.next_run_at
        );
    }
    // A tick at most a minute late still starts under `skip`.
    clock.advance(Duration::from_secs(2 * 60 + 30));
    assert_eq!(engine.run_schedules().await.unwrap().len(), 2);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_paused_schedule_starts_nothing_and_resumes_from_its_next_tick(pool: PgPool) {
    let (engines, clock) = fleet(&pool, 1).await;
    let engine = &engines[0];
    engine
        .put_schedule(&every("p", "10s", "run_once"))
        .await
        .unwrap();
    assert!(engine.pause_schedule("p", true).await.unwrap().paused);
    clock.advance(Duration::from_secs(60));
    assert!(engine.run_schedules().await.unwrap().is_empty());
    let resumed = engine.pause_schedule("p", false).await.unwrap();
    assert!(
        resumed.next_run_at > flotilla_store::Clock::now(&*clock),
        "the paused ticks are not run"
    );
    clock.advance(Duration::from_secs(3));
    let again = engine.pause_schedule("p", false).await.unwrap();
    assert_eq!(
        again.next_run_at, resumed.next_run_at,
        "resuming a running schedule moves nothing"
    );
    clock.advance(Duration::from_secs(7));
    assert_eq!(engine.run_schedules().await.unwrap().len(), 1);
    engine.delete_schedule("p").await.unwrap();
    assert!(matches!(
        engine.schedule("p").await,
        Err(ScheduleError::NotFound(_))
    ));
    assert_eq!(rows(&pool).await, 1, "its job stays");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_schedule_that_cannot_work_is_refused_naming_why_and_a_repeat_changes_nothing(
    pool: PgPool,
) {
    let (engines, _) = fleet(&pool, 1).await;
    let engine = &engines[0];
    let refused = |spec: ScheduleSpec| {
        let engine = engine.clone();
        async move { engine.put_schedule(&spec).await.unwrap_err().to_string() }
    };
    let mut unknown = every("x", "1m", "skip");
    unknown.workflow_name = "ghost".into();
    assert!(refused(unknown).await.contains("unknown workflow"));
    let mut bad_input = every("x", "1m", "skip");
    bad_input.input = json!({"n": "one"});
    assert!(refused(bad_input).await.contains("input"));
    let mut bad_cron = every("x", "1m", "skip");
    (bad_cron.cron, bad_cron.interval) = (Some("every day".into()), None);
    assert!(refused(bad_cron).await.contains("cron"));
    assert!(
        refused(every("x", "1m", "sometimes"))
            .await
            .contains("missed")
    );
    assert!(
        refused(every("x", "5ms", "skip"))
            .await
            .contains("interval")
    );

    let mut daily = every("daily", "1m", "skip");
    (daily.cron, daily.interval, daily.time_zone) = (
        Some("0 9 * * *".into()),
        None,
        Some("Europe/Amsterdam".into()),
    );
    let (first, view) = engine.put_schedule(&daily).await.unwrap();
    assert_eq!(first, Put::Created);
    // The test clock reads 2026-01-01T00:00Z: 09:00 in Amsterdam is 08:00Z.
    assert_eq!(view.next_run_at.to_rfc3339(), "2026-01-01T08:00:00+00:00");
    assert_eq!(engine.put_schedule(&daily).await.unwrap().0, Put::Unchanged);
    daily.input = json!({"n": 2});
    assert_eq!(engine.put_schedule(&daily).await.unwrap().0, Put::Replaced);
}

/// A burst of due schedules on a healthy fleet is worked through, not
/// judged missed (review L1): 100 schedules due at the same tick take two
/// passes of 64; the second, a slow minute and more after the first, still
/// starts every remaining tick, since the burst began within the grace.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_burst_of_due_schedules_is_started_across_passes_not_skipped(pool: PgPool) {
    let (engines, clock) = fleet(&pool, 1).await;
    for n in 0..100 {
        engines[0]
            .put_schedule(&every(&format!("daily-{n}"), "1d", "skip"))
            .await
            .unwrap();
    }
    clock.advance(Duration::from_secs(24 * 3600 + 10));
    let first = engines[0].run_schedules().await.unwrap();
    assert_eq!(first.len(), 64);
    clock.advance(Duration::from_secs(70));
    let second = engines[0].run_schedules().await.unwrap();
    assert_eq!(second.len(), 36, "the burst's tail was counted as missed");
}

/// A schedule replaced while its tick is due and not yet started keeps
/// that tick (review L2): the next pass starts it, with the new input.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_schedule_replaced_while_its_tick_is_due_still_starts_that_tick(pool: PgPool) {
    let (engines, clock) = fleet(&pool, 1).await;
    engines[0]
        .put_schedule(&every("daily", "1d", "skip"))
        .await
        .unwrap();
    // The tick is due; no pass has taken it yet when the schedule changes.
    clock.advance(Duration::from_millis(24 * 3600 * 1000 + 400));
    let mut changed = every("daily", "1d", "skip");
    changed.input = json!({"n": 2});
    let (put, _) = engines[0].put_schedule(&changed).await.unwrap();
    assert_eq!(put, Put::Replaced);
    let started = engines[0].run_schedules().await.unwrap();
    assert_eq!(started.len(), 1, "the due tick was dropped by the replace");
    // And only once: the next pass starts nothing more for it.
    assert!(engines[0].run_schedules().await.unwrap().is_empty());
}

/// A schedule whose tick the store refuses (here a trigger refuses its
/// job's row as data) is paused, said loudly, and the schedules due after
/// it still start in the same pass: one bad row is no head of the line.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_schedule_the_store_refuses_is_paused_and_the_others_still_start(pool: PgPool) {
    let (engines, clock) = fleet(&pool, 1).await;
    crate::support::refuse_as_data(&pool, "INSERT", "NEW.input ? 'poison'").await;
    let mut poisoned = every("poisoned", "1m", "skip");
    poisoned.input = json!({"n": 1, "poison": true});
    engines[0].put_schedule(&poisoned).await.unwrap();
    engines[0]
        .put_schedule(&every("healthy", "2m", "skip"))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(120));
    let started = engines[0]
        .run_schedules()
        .await
        .expect("the pass goes past the refused schedule");
    let healthy = engines[0].schedule("healthy").await.unwrap();
    assert_eq!(started, [healthy.last_job_id.unwrap()]);
    let refused = engines[0].schedule("poisoned").await.unwrap();
    assert!(refused.paused, "the refused schedule is paused");
    assert_eq!(refused.last_job_id, None);
    assert_eq!(rows(&pool).await, 1, "nothing of the refused tick");
}
