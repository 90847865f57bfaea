//! The database's own ceiling: `pgbench` running, on a scratch database of
//! the same server, exactly the statements one job needs today, one
//! transaction per commit point as the engine commits them: the submission
//! with its ACCEPTED row, the claim, each checkpoint with its outbox row, the
//! completion with its outbox row, and the relay's marking of the job's rows.
//! Each pgbench transaction is one whole job, so its rate is jobs/s.

use std::process::Command;

use flotilla_tests::scratch::ScratchDatabase;

use crate::report::Report;

/// What a stored definition and an outbox row's event weigh, roughly as
/// the engine writes them (the event without what the row's columns hold).
const DEFINITION: &str = r#"{"name": "bench", "input_schema": {}, "max_attempts": 3, "steps": [{"name": "step1", "target": "bench", "method": "lookup"}, {"name": "step2", "target": "bench", "method": "lookup"}, {"name": "step3", "target": "bench", "method": "lookup"}]}"#;
const BODY: &str = r#"{"workflow_name": "bench", "attempt": 1, "step_name": "step1", "occurred_at": "2026-11-30T12:00:00.000000Z"}"#;

/// The pgbench script of one job with `steps` checkpoints.
fn script(steps: usize) -> String {
    let outbox = |sequence: &str, kind: &str| {
        format!(
            "INSERT INTO workflow_run_outbox (event_id, job_id, sequence, event_type, body, traceparent, tracestate, created_at)\n  VALUES (gen_random_uuid(), ':job', {sequence}, '{kind}', '{BODY}', NULL, NULL, now());\n"
        )
    };
    let mut script = String::new();
    // Submission: the row and its ACCEPTED event.
    script.push_str(&format!(
        "BEGIN;\nINSERT INTO workflow_run (job_id, workflow_name, workflow_version, definition, input, request_digest, status, max_attempts, run_after, error, verdict, event_sequence, traceparent, tracestate, created_at, updated_at)\n  VALUES (gen_random_uuid(), 'bench', 1, '{DEFINITION}', '{{\"n\": 1}}', md5(random()::text), 'QUEUED', 3, now(), NULL, NULL, 1, NULL, NULL, now(), now())\n  ON CONFLICT (job_id) DO NOTHING RETURNING job_id AS job \\gset\n{}COMMIT;\n",
        outbox("1", "ACCEPTED")
    ));
    // The claim: one statement, the oldest eligible row.
    script.push_str(
        "WITH picked AS (SELECT job_id AS picked_id FROM workflow_run WHERE status = 'QUEUED' AND run_after <= now() ORDER BY run_after, created_at LIMIT 1 FOR UPDATE SKIP LOCKED)\n  UPDATE workflow_run SET status = 'RUNNING', lease_owner = 'bench', lease_token = gen_random_uuid(), lease_until = now() + interval '5 minutes', attempt = attempt + 1, updated_at = now()\n  FROM picked WHERE job_id = picked_id\n  RETURNING job_id AS job, lease_token AS token \\gset\n",
    );
    let fenced = "WHERE job_id = ':job' AND lease_token = ':token' AND status = 'RUNNING'\n  RETURNING job_id, event_sequence AS seq, workflow_name, attempt, traceparent, tracestate \\gset\n";
    let next = "event_sequence = event_sequence + 1, lease_losses = 0, unplaced_since = NULL, updated_at = now()";
    for step in 1..=steps {
        script.push_str(&format!(
            "BEGIN;\nUPDATE workflow_run SET checkpoints = checkpoints || jsonb_build_array('{{\"name\": \"step{step}\", \"skipped\": false, \"response\": {{\"ok\": true}}}}'::jsonb), {next}\n  {fenced}{}COMMIT;\n",
            outbox(":seq", "STEP_CHECKPOINT")
        ));
    }
    script.push_str(&format!(
        "BEGIN;\nUPDATE workflow_run SET status = 'COMPLETED', result = '{{\"ok\": true}}', verdict = 'done', error = NULL, lease_owner = NULL, lease_token = NULL, lease_until = NULL, {next}\n  {fenced}{}COMMIT;\n",
        outbox(":seq", "COMPLETED")
    ));
    // The relay writes nothing per row: one progress row per bucket and
    // batch, a share of a job too small to stand for here.
    script
}

/// Runs the script for `seconds` with `clients` connections; jobs/s.
async fn pgbench(steps: usize, clients: usize, seconds: u64) -> anyhow::Result<f64> {
    let database = ScratchDatabase::create("bench_ceiling", 1).await?;
    // A queue to claim from, so a claim never finds it empty.
    sqlx::query(&format!(
        "INSERT INTO workflow_run (job_id, workflow_name, workflow_version, definition, input, request_digest, status, max_attempts, event_sequence)
         SELECT gen_random_uuid(), 'bench', 1, '{DEFINITION}', '{{}}', 'seed', 'QUEUED', 3, 1 FROM generate_series(1, 1000)"
    ))
    .execute(&database.pool)
    .await?;
    let file = std::env::temp_dir().join(format!("flotilla-ceiling-{steps}.sql"));
    std::fs::write(&file, script(steps))?;
    let output = tokio::task::spawn_blocking({
        let url = database.url().to_owned();
        let file = file.clone();
        move || {
            Command::new("pgbench")
                .args([
                    "-n",
                    "-c",
                    &clients.to_string(),
                    "-j",
                    "2",
                    "-T",
                    &seconds.to_string(),
                    "-f",
                ])
                .arg(&file)
                .arg(url)
                .output()
        }
    })
    .await??;
    let _ = std::fs::remove_file(&file);
    database.drop_now().await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "pgbench failed: {}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|tps| tps.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no tps in pgbench's output:\n{stdout}"))
}

/// The ceiling for a 3-step and a 1-step job at the engine's default
/// concurrency (4 claim loops).
pub(crate) async fn run(report: &mut Report, smoke: bool) -> anyhow::Result<()> {
    let seconds = if smoke { 3 } else { 30 };
    for steps in [3, 1] {
        let rate = pgbench(steps, 4, seconds).await?;
        report.add(
            "ceiling",
            format!("pgbench, {steps}-step job, one transaction per commit point, 4 clients"),
            rate,
            "jobs/s",
        );
    }
    Ok(())
}
