//! Engine figures on this machine: jobs per second for a 3-step workflow
//! with in-process no-op targets in one process, and the wake-up latency
//! from a submission's commit to the first step's call.
//!
//! `cargo run --release -p flotilla-worker --example engine_throughput -- [jobs] [loops]`
//! with `DATABASE_URL` pointing at a server where it may create (and drop)
//! a scratch database.
//!
//! The cost of trace export: with `FLOTILLA_BENCH_OTLP_SINK=127.0.0.1:4318`
//! and `OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318` the example
//! serves an OTLP/HTTP sink itself (counting what arrives) and exports every
//! span to it, as a worker would; without them no exporter is installed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_tests::scratch::ScratchDatabase;
use flotilla_worker::engine::{
    Engine, EngineSettings, RefusalMode, Submission, SystemClock, WorkflowRef,
};
use flotilla_worker::targets::{FnTarget, StepFailure, TargetCall, Targets};
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let received = otlp_sink().await?;
    let telemetry = flotilla_runtime::telemetry::TelemetryConfig {
        log_filter: "warn,flotilla_worker=info,flotilla_engine=info".into(),
        log_format: flotilla_runtime::telemetry::LogFormat::Text,
        log_json: false,
    };
    let guard = flotilla_runtime::telemetry::init(&telemetry, "engine_throughput")?;
    let outcome = run().await;
    drop(guard); // flushes what is left
    if let Some(received) = received {
        println!(
            "OTLP sink: {} export requests, {} bytes received",
            received.0.load(std::sync::atomic::Ordering::Relaxed),
            received.1.load(std::sync::atomic::Ordering::Relaxed)
        );
    }
    outcome
}

/// Counts of what the sink received: requests, bytes.
type Received = Arc<(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64)>;

/// An OTLP/HTTP endpoint that accepts and counts exports, when asked for.
async fn otlp_sink() -> anyhow::Result<Option<Received>> {
    let Ok(address) = std::env::var("FLOTILLA_BENCH_OTLP_SINK") else {
        return Ok(None);
    };
    let received: Received = Arc::default();
    let counts = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let counts = counts.clone();
            async move {
                counts.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                counts
                    .1
                    .fetch_add(body.len() as u64, std::sync::atomic::Ordering::Relaxed);
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(&address).await?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(Some(received))
}

async fn run() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let jobs: usize = args.next().map_or(Ok(5_000), |a| a.parse())?;
    let loops: usize = args.next().map_or(Ok(8), |a| a.parse())?;
    let scratch = ScratchDatabase::create("flotilla_bench", loops as u32 + 4).await?;
    let result = measure(&scratch.pool, jobs, loops).await;
    scratch.drop_now().await?;
    result
}

fn no_op_targets(called: Option<mpsc::UnboundedSender<Instant>>) -> Targets {
    let mut targets = Targets::default();
    targets.register(
        "noop",
        Arc::new(FnTarget(move |call: TargetCall| {
            if let (Some(called), "one") = (&called, call.step_name.as_str()) {
                let _ = called.send(Instant::now());
            }
            async { Ok::<_, StepFailure>(json!({})) }
        })),
        64,
    );
    targets
}

fn build_engine(pool: &PgPool, loops: usize, targets: Targets, name: &str) -> Engine {
    let mut settings = EngineSettings::new(name);
    settings.claim_loops = loops;
    Engine::new(pool.clone(), targets, Arc::new(SystemClock), settings)
}

async fn submit(engine: &Engine) -> anyhow::Result<()> {
    let submission = Submission {
        metadata: None,
        priority: 0,
        job_id: Uuid::new_v4(),
        workflow: WorkflowRef::Stored("bench".into()),
        input: json!({"n": 1}),
        traceparent: None,
        tracestate: None,
    };
    engine.submit(submission, RefusalMode::Refuse).await?;
    Ok(())
}

async fn completed(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM workflow_run WHERE status = 'COMPLETED'")
            .fetch_one(pool)
            .await?,
    )
}

async fn measure(pool: &PgPool, jobs: usize, loops: usize) -> anyhow::Result<()> {
    let step = |name: &str| json!({"name": name, "target": "noop", "method": name, "rules": ["n = input.n"]});
    let workflow = json!({"name": "bench", "input_schema": {}, "steps": [step("one"), step("two"), step("three")]});

    // Throughput: a backlog of `jobs`, drained by `loops` claim loops.
    let engine = build_engine(pool, loops, no_op_targets(None), "bench");
    engine.register_workflow(&workflow).await?;
    let started = Instant::now();
    for _ in 0..jobs {
        submit(&engine).await?;
    }
    let submitted = started.elapsed();
    let stop = CancellationToken::new();
    let runner = tokio::spawn({
        let (engine, stop) = (engine.clone(), stop.clone());
        async move { engine.run(stop, Duration::from_secs(10)).await }
    });
    let drain = Instant::now();
    while completed(pool).await? < jobs as i64 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained = drain.elapsed();
    stop.cancel();
    runner.await?;
    println!(
        "submit: {jobs} jobs in {:.2} s ({:.0} jobs/s, one transaction each)",
        submitted.as_secs_f64(),
        jobs as f64 / submitted.as_secs_f64()
    );
    println!(
        "run:    {jobs} 3-step jobs in {:.2} s with {loops} loops: {:.0} jobs/s ({:.0} checkpoints/s)",
        drained.as_secs_f64(),
        jobs as f64 / drained.as_secs_f64(),
        3.0 * jobs as f64 / drained.as_secs_f64()
    );

    // Wake-up: idle loops, one job at a time, submitted in this process and from another.
    for (label, same_process) in [
        ("same process (in-process signal)", true),
        ("other process (its NOTIFY after the commit)", false),
    ] {
        let (called, mut calls) = mpsc::unbounded_channel();
        let runner_engine = build_engine(pool, loops, no_op_targets(Some(called)), "runner");
        let submitter = if same_process {
            runner_engine.clone()
        } else {
            build_engine(pool, 1, no_op_targets(None), "client")
        };
        let stop = CancellationToken::new();
        let runner = tokio::spawn({
            let stop = stop.clone();
            async move { runner_engine.run(stop, Duration::from_secs(10)).await }
        });
        let mut latencies = Vec::new();
        for _ in 0..50 {
            // Let the loops fall idle (their poll interval grows to its maximum).
            tokio::time::sleep(Duration::from_millis(700)).await;
            let before = Instant::now();
            submit(&submitter).await?;
            let arrived = calls
                .recv()
                .await
                .ok_or_else(|| anyhow::anyhow!("runner stopped"))?;
            latencies.push(arrived.duration_since(before));
        }
        stop.cancel();
        runner.await?;
        latencies.sort();
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        println!(
            "wake-up, {label}: p50 {:?}, p99 {:?}, max {:?}",
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
    Ok(())
}
