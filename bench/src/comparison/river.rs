//! River (Go, from the Go module proxy, pinned in `bench/river/go.sum`),
//! run by `bench/river/main.go`, built beside the benchmark's binary.
//!
//! River fetches at most its worker count per fetch and waits its fetch
//! cooldown (100 ms by default) between fetches, so with 16 workers its
//! default drains at most 160 jobs/s: it runs twice, at its default and at
//! the shortest cooldown it accepts (1 ms), and the second is the figure
//! the ratios use: River at its fastest.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::report::Report;

/// The drain program, built from `dir` beside the benchmark's own binary.
fn build(dir: &Path) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let program = exe.with_file_name("river-drain");
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&program)
        .arg(".")
        .current_dir(dir)
        .status()
        .map_err(|e| anyhow::anyhow!("go (1.24 or later) runs River's drain: {e}"))?;
    anyhow::ensure!(status.success(), "go build in {} failed", dir.display());
    Ok(program)
}

/// River's jobs/s and WAL per job for `jobs` no-op jobs, at its default
/// fetch cooldown and at 1 ms.
pub(crate) async fn figures(report: &mut Report, jobs: usize) -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("river");
    let program = build(&dir)?;
    for (cooldown, label) in [
        (100, "its default 100 ms fetch cooldown"),
        (1, "1 ms fetch cooldown"),
    ] {
        let drained = super::drain(
            "River",
            &dir,
            &program,
            vec![jobs.to_string()],
            vec![("FETCH_COOLDOWN_MS", cooldown.to_string())],
            "bench_river",
        )
        .await?;
        report.add(
            "comparison",
            format!("River 0.51.2, {jobs} no-op jobs, 16 at once, {label}"),
            drained.jobs_per_second,
            "jobs/s",
        );
        report.add(
            "comparison",
            format!("River WAL per no-op job, {label}"),
            drained.wal_bytes_per_job,
            "bytes",
        );
    }
    Ok(())
}
