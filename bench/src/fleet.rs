//! The console's fleet view against a large history: `Engine::fleet` with
//! a million published events of the last hour in the outbox, which the
//! view must not read.

use std::sync::Arc;
use std::time::Instant;

use flotilla_tests::scratch::ScratchDatabase;
use flotilla_worker::engine::{Engine, EngineSettings, SystemClock};
use flotilla_worker::targets::Targets;

use crate::report::Report;

/// Milliseconds of `Engine::fleet`, p50 of 20 reads, with `events`
/// published COMPLETED events of the last hour in the outbox.
pub(crate) async fn run(report: &mut Report, smoke: bool) -> anyhow::Result<()> {
    let events: i64 = if smoke { 10_000 } else { 1_000_000 };
    let database = ScratchDatabase::create("bench_fleet", 4).await?;
    let pool = database.pool.clone();
    sqlx::query(
        "INSERT INTO workflow_run_outbox (event_id, job_id, sequence, event_type, payload, created_at)
         SELECT gen_random_uuid(), gen_random_uuid(), 5, 'COMPLETED', '{}',
             now() - (n % 3600) * interval '1 second'
         FROM generate_series(1, $1) n",
    )
    .bind(events)
    .execute(&pool)
    .await?;
    // Published: every bucket's progress past them.
    sqlx::query("UPDATE relay_bucket SET published = pg_current_snapshot()")
        .execute(&pool)
        .await?;
    sqlx::query("VACUUM ANALYZE workflow_run_outbox")
        .execute(&pool)
        .await?;
    let engine = Engine::new(
        pool.clone(),
        Targets::default(),
        Arc::new(SystemClock),
        EngineSettings::new("bench-fleet"),
    );
    let mut took = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        engine.fleet().await?;
        took.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    took.sort_by(f64::total_cmp);
    report.add(
        "components",
        format!("fleet view p50, {events} events of the last hour in the outbox"),
        took[took.len() / 2],
        "ms",
    );
    engine.close().await;
    database.drop_now().await?;
    Ok(())
}
