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

mod measure;
use measure::*;

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
