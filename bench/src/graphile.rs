//! The comparison: graphile-worker (Node.js, from the npm registry, pinned
//! in `bench/graphile/package-lock.json`) draining the same number of no-op
//! jobs on a scratch database of the same server, 16 at once (Flotilla's
//! default claim loops).

use std::path::Path;
use std::process::Command;

use flotilla_tests::scratch::ScratchDatabase;

use crate::report::Report;

/// Installs graphile-worker beside its script, once.
fn install(dir: &Path) -> anyhow::Result<()> {
    if dir.join("node_modules/graphile-worker").exists() {
        return Ok(());
    }
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--silent"])
        .current_dir(dir)
        .status()?;
    anyhow::ensure!(status.success(), "npm ci in {} failed", dir.display());
    Ok(())
}

/// graphile-worker's jobs/s for `jobs` no-op jobs.
pub(crate) async fn figures(report: &mut Report, jobs: usize) -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphile");
    install(&dir)?;
    let database = ScratchDatabase::create("bench_graphile", 1).await?;
    let output = {
        let (dir, url) = (dir.clone(), database.url().to_owned());
        tokio::task::spawn_blocking(move || {
            Command::new("node")
                .arg("drain.mjs")
                .arg(jobs.to_string())
                .env("DATABASE_URL", url)
                .env("CONCURRENCY", "16")
                .current_dir(dir)
                .output()
        })
        .await??
    };
    database.drop_now().await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "graphile-worker's run failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let result: serde_json::Value = serde_json::from_str(last)
        .map_err(|e| anyhow::anyhow!("graphile-worker printed {last:?}: {e}"))?;
    let rate = result["jobs_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow::anyhow!("no jobs_per_second in {last}"))?;
    report.add(
        "comparison",
        format!("graphile-worker 0.16.6, {jobs} no-op jobs, 16 at once"),
        rate,
        "jobs/s",
    );
    let wal = result["wal_bytes_per_job"]
        .as_f64()
        .ok_or_else(|| anyhow::anyhow!("no wal_bytes_per_job in {last}"))?;
    report.add(
        "comparison",
        "graphile-worker WAL per no-op job",
        wal,
        "bytes",
    );
    Ok(())
}
