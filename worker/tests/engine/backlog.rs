//! A steady backlog of fast jobs: batching never keeps a claimed job
//! waiting past its lease. The claim and the commit batches are served by a
//! task of their own (not by a loop whose job would wait meanwhile), and a
//! segment that starts late renews its lease, fenced, before its first
//! step.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flotilla_worker::engine::{Engine, Outcome, SystemClock};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{self, Calls, echo_targets, stored};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

const JOBS: usize = 20_000;
const LOOPS: usize = 16;

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_backlog_of_fast_jobs_never_lapses_a_lease_nor_calls_a_target_twice(pool: PgPool) {
    let calls = Calls::default();
    let mut settings = support::settings("backlog");
    settings.lease = Duration::from_secs(2);
    settings.claim_loops = LOOPS;
    let engine = Engine::new(
        pool.clone(),
        echo_targets(&calls),
        Arc::new(SystemClock),
        settings,
    );
    engine
        .register_workflow(&json!({"name": "noop", "input_schema": {},
            "steps": [{"name": "only", "target": "echo", "method": "m"}]}))
        .await
        .unwrap();
    for chunk in 0..JOBS / 1000 {
        let batch = (0..1000)
            .map(|n| stored(Uuid::new_v4(), "noop", json!({"n": chunk * 1000 + n})))
            .collect();
        let outcomes = engine.submit_batch(batch).await.unwrap();
        assert!(outcomes.iter().all(Result::is_ok));
    }

    // The sweeper runs all along: any lease that lapses is counted.
    let swept = Arc::new(AtomicU64::new(0));
    let sweeper = tokio::spawn({
        let (engine, swept) = (engine.clone(), swept.clone());
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                swept.fetch_add(engine.sweep().await.unwrap(), Ordering::Relaxed);
            }
        }
    });
    let loops: Vec<_> = (0..LOOPS)
        .map(|_| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let mut outcomes: HashMap<&'static str, usize> = HashMap::new();
                loop {
                    let outcome = engine.run_once().await.unwrap();
                    let kind = match outcome {
                        Outcome::Idle => break,
                        Outcome::Completed(_) => "completed",
                        Outcome::LeaseLost(_) => "lease lost",
                        _ => "other",
                    };
                    *outcomes.entry(kind).or_default() += 1;
                }
                outcomes
            })
        })
        .collect();
    let mut totals: HashMap<&'static str, usize> = HashMap::new();
    for task in loops {
        for (kind, n) in task.await.unwrap() {
            *totals.entry(kind).or_default() += n;
        }
    }
    sweeper.abort();
    assert_eq!(totals.get("lease lost"), None, "{totals:?}");
    assert_eq!(totals.get("completed"), Some(&JOBS), "{totals:?}");
    assert_eq!(swept.load(Ordering::Relaxed), 0, "leases lapsed");
    let per_step = calls.per_job_step();
    assert_eq!(per_step.len(), JOBS);
    assert!(
        per_step.values().all(|&n| n == 1),
        "a target was called twice for a job"
    );
}
