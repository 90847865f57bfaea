//! The comparisons: other Postgres job queues draining the same number of
//! no-op jobs on a scratch database of the same server, 16 at once
//! (Flotilla's default claim loops), each measured by a small program of
//! its own that prints its figures as JSON on its last line.

use std::path::Path;
use std::process::Command;

use flotilla_tests::scratch::ScratchDatabase;

pub(crate) mod graphile;
pub(crate) mod river;

/// What a competitor's drain printed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drained {
    pub jobs_per_second: f64,
    pub wal_bytes_per_job: f64,
}

/// Runs `program` (with `args` and `envs`, in `dir`) against a fresh
/// scratch database named `database`, whose URL it gets as `DATABASE_URL`,
/// and reads its last line.
pub(crate) async fn drain(
    name: &str,
    dir: &Path,
    program: &Path,
    args: Vec<String>,
    envs: Vec<(&'static str, String)>,
    database: &str,
) -> anyhow::Result<Drained> {
    let database = ScratchDatabase::create(database, 1).await?;
    let output = {
        let (dir, program, url) = (
            dir.to_owned(),
            program.to_owned(),
            database.url().to_owned(),
        );
        tokio::task::spawn_blocking(move || {
            Command::new(program)
                .args(args)
                .envs(envs)
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
        "{name}'s run failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let result: serde_json::Value =
        serde_json::from_str(last).map_err(|e| anyhow::anyhow!("{name} printed {last:?}: {e}"))?;
    let figure = |field: &str| {
        result[field]
            .as_f64()
            .ok_or_else(|| anyhow::anyhow!("{name} printed no {field} in {last}"))
    };
    Ok(Drained {
        jobs_per_second: figure("jobs_per_second")?,
        wal_bytes_per_job: figure("wal_bytes_per_job")?,
    })
}
