//! graphile-worker (Node.js, from the npm registry, pinned in
//! `bench/graphile/package-lock.json`), run by `bench/graphile/drain.mjs`.

use std::path::Path;
use std::process::Command;

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

/// graphile-worker's jobs/s and WAL per job for `jobs` no-op jobs.
pub(crate) async fn figures(report: &mut Report, jobs: usize) -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphile");
    install(&dir)?;
    let drained = super::drain(
        "graphile-worker",
        &dir,
        Path::new("node"),
        vec!["drain.mjs".into(), jobs.to_string()],
        Vec::new(),
        "bench_graphile",
    )
    .await?;
    report.add(
        "comparison",
        format!("graphile-worker 0.16.6, {jobs} no-op jobs, 16 at once"),
        drained.jobs_per_second,
        "jobs/s",
    );
    report.add(
        "comparison",
        "graphile-worker WAL per no-op job",
        drained.wal_bytes_per_job,
        "bytes",
    );
    Ok(())
}
