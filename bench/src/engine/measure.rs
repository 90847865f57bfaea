//! One measured engine run: submit, wait for every job to reach its end,
//! read the figures (time, WAL, row updates) back from the database.

use super::*;

pub(super) async fn submit(engine: &Engine, workflow: &str, jobs: usize) -> anyhow::Result<()> {
    for n in 0..jobs {
        let submission = Submission {
            metadata: None,
            priority: 0,
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
pub(super) async fn reached(pool: &PgPool, status: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM workflow_run WHERE workflow_name = 'bench' AND status = $1",
    )
    .bind(status)
    .fetch_one(pool)
    .await?)
}

pub(super) async fn wal_position(pool: &PgPool) -> anyhow::Result<String> {
    Ok(sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?)
}

pub(super) async fn wal_between(pool: &PgPool, from: &str, to: &str) -> anyhow::Result<f64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::float8")
            .bind(from)
            .bind(to)
            .fetch_one(pool)
            .await?,
    )
}

pub(super) async fn wal_since(pool: &PgPool, from: &str) -> anyhow::Result<f64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
            .bind(from)
            .fetch_one(pool)
            .await?,
    )
}

/// What one run measured.
pub(super) struct Run {
    pub(super) jobs_per_second: f64,
    /// From a job's claim to the start of its segment (the time its lease
    /// ran without a heartbeat), p99 over the run.
    pub(super) claim_to_segment_p99_ms: f64,
    /// The claim statement alone.
    pub(super) claim_p50_ms: f64,
    /// The claim and its commit.
    pub(super) committed_claim_p50_ms: f64,
    pub(super) wal_bytes_per_job: f64,
    /// Where that WAL went, when `pg_waldump` can run here.
    pub(super) wal_breakdown: Option<crate::wal::Breakdown>,
    /// Share of `workflow_run` updates that were HOT (no index touched).
    pub(super) hot_share: f64,
    /// Finished runs retention removed per second while the jobs ran (0
    /// unless `Shape::retention_running`).
    pub(super) removed_per_second: f64,
    /// The relay's WAL per job publishing the jobs' events, and where it
    /// went (only with `Shape::publish`).
    pub(super) published: Option<(f64, Option<crate::wal::Breakdown>)>,
}

/// `workflow_run`'s updates and HOT updates, once the counters settle
/// (backends report them a moment after their transactions end).
pub(super) async fn updates(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
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
pub(super) async fn run(
    finished: i64,
    loops: usize,
    jobs: usize,
    shape: Shape,
) -> anyhow::Result<Run> {
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
