//! The engine alone, in process, with no-op targets: claim latency and
//! jobs/s as finished history grows, jobs/s by claim loops, WAL bytes per
//! job, and what the checkpoint layout costs for large responses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_store::runs::lease;
use flotilla_tests::scratch::ScratchDatabase;
use flotilla_worker::engine::{
    Engine, EngineSettings, RefusalMode, Submission, Switch, SystemClock, WorkflowRef,
};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::report::Report;

/// What the measured jobs are.
#[derive(Debug, Clone, Copy)]
struct Shape {
    steps: usize,
    /// Bytes of random text in each step's response (0: an empty object).
    response_bytes: usize,
    checkpoint_rows: bool,
    /// Whether the last step is external: each job parks (WAITING) there
    /// instead of completing.
    parks: bool,
    /// A graph instead of a chain: a root, this many branches needing it,
    /// and a join needing every branch (`steps` is then ignored).
    fan_out: Option<usize>,
    /// The finished history is past its retention (8 days old), and
    /// retention passes remove it, one after another, from before the
    /// measured claims to the last job's end.
    retention_running: bool,
    /// Once the jobs are done, a relay publishes their events (to the
    /// mock cluster), its WAL measured apart from the engine's.
    publish: bool,
}

impl Shape {
    /// `steps` no-op steps with empty responses, checkpoints laid out as
    /// the worker binaries' setting says.
    fn small(steps: usize) -> Self {
        Self {
            steps,
            response_bytes: 0,
            checkpoint_rows: checkpoint_rows(),
            parks: false,
            fan_out: None,
            retention_running: false,
            publish: false,
        }
    }

    /// Steps each job runs.
    fn nodes(&self) -> usize {
        self.fan_out
            .map_or(self.steps + usize::from(self.parks), |n| n + 2)
    }
}

fn engine(pool: &PgPool, loops: usize, shape: Shape) -> Engine {
    let mut targets = Targets::default();
    let bytes = shape.response_bytes;
    targets.register(
        "noop",
        Arc::new(FnTarget(move |_: TargetCall| async move {
            // Random hex, which the TOAST compression cannot shrink, as a
            // real payload of that size would not shrink much either.
            let text: String = std::iter::repeat_with(|| Uuid::new_v4().simple().to_string())
                .take(bytes.div_ceil(32))
                .collect();
            Ok::<_, StepFailure>(if bytes == 0 {
                json!({})
            } else {
                json!({ "text": text })
            })
        })),
        256,
    );
    let mut settings = EngineSettings::new("bench-engine");
    settings.claim_loops = loops;
    settings.definition_by_reference = switch(definition_by_reference());
    settings.checkpoint_rows = switch(shape.checkpoint_rows);
    Engine::new(pool.clone(), targets, Arc::new(SystemClock), settings)
}

/// Whether jobs point at their stored version, as the worker binaries read
/// it (the end-to-end runs' workers inherit the variable): on unless set
/// `false`, since no worker of an earlier release shares the benchmark's
/// databases (`auto` turns it on).
pub(crate) fn definition_by_reference() -> bool {
    std::env::var("FLOTILLA_DEFINITION_BY_REFERENCE").map_or(true, |value| value != "false")
}

/// Whether runs keep their checkpoints as rows, as the worker binaries read
/// it (the end-to-end runs' workers inherit the variable): on unless set
/// `false`, as for [`definition_by_reference`].
pub(crate) fn checkpoint_rows() -> bool {
    std::env::var("FLOTILLA_CHECKPOINT_ROWS").map_or(true, |value| value != "false")
}

fn switch(on: bool) -> Switch {
    if on { Switch::True } else { Switch::False }
}

/// The engine's histogram of the time from a claim to its segment's start.
const CLAIM_TO_SEGMENT: &str = "flotilla_claim_to_segment_seconds";

/// `rows` COMPLETED 3-step jobs, as the engine leaves them, finished
/// `days_ago`.
pub(crate) async fn history(pool: &PgPool, rows: i64, days_ago: i32) -> anyhow::Result<()> {
    let mut done = 0;
    while done < rows {
        let count = (rows - done).min(100_000);
        sqlx::query(
            "INSERT INTO workflow_run (job_id, workflow_name, workflow_version, definition, input,
                 request_digest, status, attempt, max_attempts, checkpoints, result, verdict,
                 event_sequence, created_at, updated_at)
             SELECT gen_random_uuid(), 'old', 1, '{\"name\": \"old\", \"steps\": []}', '{\"n\": 1}',
                 md5(n::text), 'COMPLETED', 1, 3,
                 '[{\"name\": \"one\", \"skipped\": false, \"response\": {}}]', '{}', 'done', 5,
                 now() - make_interval(days => $2), now() - make_interval(days => $2)
             FROM generate_series(1, $1) n",
        )
        .bind(count)
        .bind(days_ago)
        .execute(pool)
        .await?;
        done += count;
    }
    // Old history is vacuumed and on disk: no autovacuum pass or checkpoint
    // of the freshly inserted rows inside the measurement.
    sqlx::query("VACUUM ANALYZE workflow_run")
        .execute(pool)
        .await?;
    if let Err(e) = sqlx::query("CHECKPOINT").execute(pool).await {
        eprintln!("bench: CHECKPOINT refused ({e}); the run may share the disk with one");
    }
    Ok(())
}

async fn submit(engine: &Engine, workflow: &str, jobs: usize) -> anyhow::Result<()> {
    for n in 0..jobs {
        let submission = Submission {
            job_id: Uuid::new_v4(),
            workflow: WorkflowRef::Stored(workflow.into()),
            input: json!({"n": n}),
            traceparent: None,
            tracestate: None,
        };
        engine.submit(submission, RefusalMode::Refuse).await?;
    }
    Ok(())
}

/// The measured jobs that reached `status`. Through the workflow's index,
/// so its cost follows the jobs measured, not the history: a count that
/// read every finished row would take a core from the engine at 1M rows.
async fn reached(pool: &PgPool, status: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM workflow_run WHERE workflow_name = 'bench' AND status = $1",
    )
    .bind(status)
    .fetch_one(pool)
    .await?)
}

async fn wal_position(pool: &PgPool) -> anyhow::Result<String> {
    Ok(sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?)
}

async fn wal_between(pool: &PgPool, from: &str, to: &str) -> anyhow::Result<f64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::float8")
            .bind(from)
            .bind(to)
            .fetch_one(pool)
            .await?,
    )
}

async fn wal_since(pool: &PgPool, from: &str) -> anyhow::Result<f64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
            .bind(from)
            .fetch_one(pool)
            .await?,
    )
}

/// What one run measured.
struct Run {
    jobs_per_second: f64,
    /// From a job's claim to the start of its segment (the time its lease
    /// ran without a heartbeat), p99 over the run.
    claim_to_segment_p99_ms: f64,
    /// The claim statement alone.
    claim_p50_ms: f64,
    /// The claim and its commit.
    committed_claim_p50_ms: f64,
    wal_bytes_per_job: f64,
    /// Where that WAL went, when `pg_waldump` can run here.
    wal_breakdown: Option<crate::wal::Breakdown>,
    /// Share of `workflow_run` updates that were HOT (no index touched).
    hot_share: f64,
    /// Finished runs retention removed per second while the jobs ran (0
    /// unless `Shape::retention_running`).
    removed_per_second: f64,
    /// The relay's WAL per job publishing the jobs' events, and where it
    /// went (only with `Shape::publish`).
    published: Option<(f64, Option<crate::wal::Breakdown>)>,
}

/// `workflow_run`'s updates and HOT updates, once the counters settle
/// (backends report them a moment after their transactions end).
async fn updates(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
    let read = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'workflow_run'",
        )
        .fetch_one(pool)
        .await
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last = read().await?;
    loop {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let now = read().await?;
        if now == last || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

/// Claims measured one at a time on a queue of `jobs`, then the rest of
/// the queue drained by `loops` loops.
async fn run(finished: i64, loops: usize, jobs: usize, shape: Shape) -> anyhow::Result<Run> {
    let database =
        ScratchDatabase::create("bench_engine", u32::try_from(loops).unwrap_or(16) + 8).await?;
    let pool = database.pool.clone();
    history(&pool, finished, if shape.retention_running { 8 } else { 1 }).await?;
    let engine = engine(&pool, loops, shape);
    engine.settle_switches(true).await?;
    // Retention passes back to back (the fleet's runs one every 10 s) from
    // before the claims are measured to the last job's end.
    let retention_stop = CancellationToken::new();
    let retention = shape.retention_running.then(|| {
        let (engine, stop) = (engine.clone(), retention_stop.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let mut removed = 0u64;
            while !stop.is_cancelled() {
                match engine.apply_retention().await {
                    Ok(pass) => removed += pass.removed,
                    Err(e) => eprintln!("bench: a retention pass failed: {e}"),
                }
            }
            (removed, started.elapsed())
        })
    });
    let step = |name: &str| json!({"name": name, "target": "noop", "method": name});
    let mut steps: Vec<_> = (1..=shape.steps)
        .map(|n| step(&format!("step{n}")))
        .collect();
    if let Some(branches) = shape.fan_out {
        let names: Vec<String> = (0..branches).map(|b| format!("branch{b}")).collect();
        steps = vec![step("root")];
        for name in &names {
            let mut branch = step(name);
            branch["needs"] = json!(["root"]);
            steps.push(branch);
        }
        let mut join = step("join");
        join["needs"] = json!(names);
        steps.push(join);
    }
    if shape.parks {
        steps.push(json!({"name": "approve", "target": "noop", "method": "approve", "completion": "external"}));
    }
    let last_status = if shape.parks { "WAITING" } else { "COMPLETED" };
    engine
        .register_workflow(&json!({"name": "bench", "input_schema": {}, "steps": steps}))
        .await?;
    let wal = wal_position(&pool).await?;
    let (updated_before, hot_before) = updates(&pool).await?;
    submit(&engine, "bench", jobs).await?;

    // Claim latency, up to 200 claims one at a time on this table: the statement
    // alone, and with its commit. The commit waits for the WAL to reach the
    // disk, and right after a checkpoint every page a claim's index entries
    // land on is written whole to the WAL (a random job id's page of the
    // primary key, one of many when the history is large): that part
    // follows the disk and the checkpoint, not the claim's plan.
    let claims_measured_from = wal_position(&pool).await?;
    let measured = jobs.min(200);
    let mut claims = Vec::with_capacity(measured);
    let mut committed = Vec::with_capacity(measured);
    {
        let mut conn = pool.acquire().await?;
        for _ in 0..measured {
            let now = chrono::Utc::now();
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            let started = Instant::now();
            let rows = lease::claim(&mut tx, "bench-claimer", now, now, 1).await?;
            claims.push(started.elapsed());
            tx.commit().await?;
            committed.push(started.elapsed());
            anyhow::ensure!(rows.len() == 1, "nothing to claim");
        }
    }
    claims.sort_unstable();
    committed.sort_unstable();
    // Those go back to the queue, leases lapsed at once.
    sqlx::query(
        "UPDATE workflow_run SET status = 'QUEUED', lease_owner = NULL, lease_token = NULL,
             lease_until = NULL, attempt = 0 WHERE lease_owner = 'bench-claimer'",
    )
    .execute(&pool)
    .await?;
    // The run's WAL leaves out those claims and their undoing: a job is
    // claimed once.
    let claims_measured_to = wal_position(&pool).await?;

    // Histograms recorded before the run are not its own.
    drop(crate::metrics::histogram(CLAIM_TO_SEGMENT));
    let stop = CancellationToken::new();
    let started = Instant::now();
    let started_at = chrono::Utc::now();
    let runner = tokio::spawn({
        let (engine, stop) = (engine.clone(), stop.clone());
        async move { engine.run(stop, Duration::from_secs(10)).await }
    });
    let deadline = started + Duration::from_secs(600);
    while reached(&pool, last_status).await? < i64::try_from(jobs)? {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the engine did not finish in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The end is the last completion itself, not when the poll saw it.
    let finished_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "SELECT max(updated_at) FROM workflow_run WHERE workflow_name = 'bench'",
    )
    .fetch_one(&pool)
    .await?;
    let elapsed = (finished_at - started_at)
        .to_std()
        .unwrap_or_else(|_| started.elapsed());
    stop.cancel();
    runner.await?;
    retention_stop.cancel();
    let removed_per_second = match retention {
        #[allow(clippy::cast_precision_loss)]
        Some(retention) => {
            let (removed, took) = retention.await?;
            removed as f64 / took.as_secs_f64()
        }
        None => 0.0,
    };
    let wal_end = wal_position(&pool).await?;
    let wal_bytes = wal_since(&pool, &wal).await?
        - wal_between(&pool, &claims_measured_from, &claims_measured_to).await?;
    let mut wal_breakdown = crate::wal::breakdown(&pool, &wal, &claims_measured_from).await?;
    if let (Some(before), Some(after)) = (
        wal_breakdown.as_mut(),
        crate::wal::breakdown(&pool, &claims_measured_to, &wal_end).await?,
    ) {
        for (key, share) in after {
            let sum = before.entry(key).or_default();
            sum.records += share.records;
            sum.bytes += share.bytes;
            sum.page_images += share.page_images;
        }
    }
    let (updated, hot) = updates(&pool).await?;
    let published = if shape.publish {
        // From here, not from the engine's end: the wait for the counters
        // above is not the relay's.
        let published_from = wal_position(&pool).await?;
        crate::relay::publish_all(&pool).await?;
        let published_end = wal_position(&pool).await?;
        #[allow(clippy::cast_precision_loss)]
        let bytes = wal_between(&pool, &published_from, &published_end).await? / jobs as f64;
        Some((
            bytes,
            crate::wal::breakdown(&pool, &published_from, &published_end).await?,
        ))
    } else {
        None
    };
    database.drop_now().await?;
    let claim_to_segment = crate::metrics::histogram(CLAIM_TO_SEGMENT);
    #[allow(clippy::cast_precision_loss)]
    Ok(Run {
        jobs_per_second: jobs as f64 / elapsed.as_secs_f64(),
        claim_to_segment_p99_ms: crate::metrics::quantile(&claim_to_segment, 0.99) * 1000.0,
        claim_p50_ms: claims[claims.len() / 2].as_secs_f64() * 1000.0,
        committed_claim_p50_ms: committed[committed.len() / 2].as_secs_f64() * 1000.0,
        wal_bytes_per_job: wal_bytes / jobs as f64,
        wal_breakdown,
        hot_share: (hot - hot_before) as f64 / (updated - updated_before).max(1) as f64,
        removed_per_second,
        published,
    })
}

/// The engine's figures: by history, then by claim loops.
pub(crate) async fn figures(report: &mut Report, smoke: bool) -> anyhow::Result<()> {
    let (histories, jobs): (&[i64], usize) = if smoke {
        (&[1_000, 10_000], 500)
    } else {
        (&[10_000, 100_000, 1_000_000], 5_000)
    };
    let loops = flotilla_worker::engine::DEFAULT_CLAIM_LOOPS;
    let mut first_claim = None;
    for &finished in histories {
        let run = run(finished, loops, jobs, Shape::small(3)).await?;
        report.add(
            "engine",
            format!("claim p50, {finished} finished rows"),
            run.claim_p50_ms,
            "ms",
        );
        report.add(
            "engine",
            format!("claim p50 with its commit, {finished} finished rows"),
            run.committed_claim_p50_ms,
            "ms",
        );
        report.add(
            "engine",
            format!("3-step jobs/s, {loops} loops, {finished} finished rows"),
            run.jobs_per_second,
            "jobs/s",
        );
        report.add(
            "engine",
            format!("WAL per 3-step job, {finished} finished rows"),
            run.wal_bytes_per_job,
            "bytes",
        );
        report.add(
            "engine",
            format!("HOT share of run-row updates, {finished} finished rows"),
            run.hot_share,
            "ratio",
        );
        let (first, first_committed) =
            *first_claim.get_or_insert((run.claim_p50_ms, run.committed_claim_p50_ms));
        report.add(
            "engine",
            format!(
                "claim p50 with {finished} finished rows / with {}",
                histories[0]
            ),
            run.claim_p50_ms / first,
            "ratio",
        );
        report.add(
            "engine",
            format!(
                "claim p50 with its commit, {finished} finished rows / with {}",
                histories[0]
            ),
            run.committed_claim_p50_ms / first_committed,
            "ratio",
        );
    }
    // A graph beside the chain: every branch a checkpoint of its own, the
    // branches called side by side.
    let branches = 10;
    let graph = Shape {
        fan_out: Some(branches),
        ..Shape::small(0)
    };
    let graphs = run(histories[0], loops, jobs, graph).await?;
    report.add(
        "engine",
        format!("graph jobs/s (fan-out {branches}, fan-in), {loops} loops"),
        graphs.jobs_per_second,
        "jobs/s",
    );
    #[allow(clippy::cast_precision_loss)]
    report.add(
        "engine",
        format!("graph steps/s (fan-out {branches}, fan-in), {loops} loops"),
        graphs.jobs_per_second * graph.nodes() as f64,
        "steps/s",
    );
    // A claim and a completion per job: the claim path with the least
    // around it (a workflow has at least one step).
    let claims = run(
        histories[0],
        loops,
        jobs,
        Shape {
            publish: true,
            ..Shape::small(1)
        },
    )
    .await?;
    report.add(
        "components",
        format!("claims/s, 1-step no-op jobs, {loops} loops, in process"),
        claims.jobs_per_second,
        "claims/s",
    );
    // How long a claimed job waits, lease running and no heartbeat, before
    // its segment starts: batching must keep this far below the lease.
    report.add(
        "components",
        format!("claim to segment start p99, 1-step no-op jobs, {loops} loops"),
        claims.claim_to_segment_p99_ms,
        "ms",
    );
    // Beside graphile-worker's figure: the database's work per job, whatever
    // the CPU it ran on.
    report.add(
        "components",
        "WAL per 1-step no-op job, in process",
        claims.wal_bytes_per_job,
        "bytes",
    );
    if let Some(shares) = &claims.wal_breakdown {
        crate::wal::print("of a 1-step no-op job", shares, jobs);
        for (relation, bytes) in crate::wal::by_relation(shares) {
            #[allow(clippy::cast_precision_loss)]
            report.add(
                "components",
                format!("WAL per 1-step no-op job in {relation}"),
                bytes as f64 / jobs as f64,
                "bytes",
            );
        }
    }
    if let Some((published, shares)) = &claims.published {
        // graphile-worker's job ends at its completion; Flotilla's ends once
        // its events are on the topic, which the relay's marks record.
        report.add(
            "components",
            "WAL per 1-step no-op job, its events published (relay)",
            *published,
            "bytes",
        );
        report.add(
            "components",
            "WAL per 1-step no-op job, engine and relay",
            claims.wal_bytes_per_job + published,
            "bytes",
        );
        if let Some(shares) = shares {
            crate::wal::print("of publishing a 1-step job's events", shares, jobs);
        }
    }
    for loops in [1, 2, 4, 8, 16] {
        let run = run(histories[0], loops, jobs, Shape::small(3)).await?;
        report.add(
            "engine",
            format!("3-step jobs/s, {loops} loop(s)"),
            run.jobs_per_second,
            "jobs/s",
        );
    }
    checkpoint_layouts(report, histories[0], loops, jobs / 10).await
}

/// What removing a backlog of finished runs costs the work beside it: a
/// history of 1,000,000 COMPLETED runs (10,000 with `--smoke`), first
/// within its retention (nothing removed), then past it, retention passes
/// removing it back to back while the claims are measured and the jobs
/// run.
pub(crate) async fn retention(report: &mut Report, smoke: bool) -> anyhow::Result<()> {
    let (finished, jobs) = if smoke {
        (10_000, 500)
    } else {
        (1_000_000, 5_000)
    };
    let loops = flotilla_worker::engine::DEFAULT_CLAIM_LOOPS;
    for retention_running in [false, true] {
        let shape = Shape {
            retention_running,
            ..Shape::small(3)
        };
        let run = run(finished, loops, jobs, shape).await?;
        let beside = if retention_running {
            format!("retention removing {finished} finished rows")
        } else {
            format!("{finished} finished rows kept")
        };
        report.add(
            "retention",
            format!("claim p50 with its commit, {beside}"),
            run.committed_claim_p50_ms,
            "ms",
        );
        report.add(
            "retention",
            format!("3-step jobs/s, {loops} loops, {beside}"),
            run.jobs_per_second,
            "jobs/s",
        );
        if retention_running {
            report.add(
                "retention",
                format!("finished runs removed/s beside the jobs, from {finished}"),
                run.removed_per_second,
                "runs/s",
            );
        }
    }
    Ok(())
}

/// Jobs that run one step and park on an external one: a claim, a
/// checkpoint and a park per job, every write a commit point that
/// concurrent jobs share.
pub(crate) async fn parking(report: &mut Report, smoke: bool) -> anyhow::Result<()> {
    let (finished, jobs) = if smoke { (1_000, 500) } else { (10_000, 5_000) };
    let loops = flotilla_worker::engine::DEFAULT_CLAIM_LOOPS;
    let shape = Shape {
        parks: true,
        ..Shape::small(1)
    };
    let run = run(finished, loops, jobs, shape).await?;
    report.add(
        "engine",
        format!("parked jobs/s (a step, then an external one), {loops} loops"),
        run.jobs_per_second,
        "jobs/s",
    );
    Ok(())
}

/// Jobs whose responses are large, their checkpoints in the run row's
/// array (each step rewrites every earlier response) and as rows of their
/// own (each written once), whatever the setting says.
async fn checkpoint_layouts(
    report: &mut Report,
    finished: i64,
    loops: usize,
    jobs: usize,
) -> anyhow::Result<()> {
    const STEPS: usize = 10;
    const RESPONSE_BYTES: usize = 4096;
    let mut wal = Vec::new();
    for (checkpoint_rows, layout) in [(false, "the row's array"), (true, "rows")] {
        let shape = Shape {
            steps: STEPS,
            response_bytes: RESPONSE_BYTES,
            checkpoint_rows,
            ..Shape::small(STEPS)
        };
        let run = run(finished, loops, jobs, shape).await?;
        report.add(
            "engine",
            format!("WAL per {STEPS}-step job of 4 KB responses, checkpoints as {layout}"),
            run.wal_bytes_per_job,
            "bytes",
        );
        report.add(
            "engine",
            format!("{STEPS}-step jobs/s, 4 KB responses, checkpoints as {layout}"),
            run.jobs_per_second,
            "jobs/s",
        );
        wal.push(run.wal_bytes_per_job);
    }
    report.add(
        "engine",
        "WAL per job of 4 KB responses, checkpoints as rows / as the row's array",
        wal[1] / wal[0],
        "ratio",
    );
    Ok(())
}
