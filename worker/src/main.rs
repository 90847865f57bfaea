use anyhow::Context as _;
use clap::Parser as _;
use flotilla_runtime::{shutdown, telemetry};
use flotilla_worker::Application;
use flotilla_worker::config::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let _telemetry = telemetry::init(&cli.worker.telemetry, "flotilla-worker")?;
    if let Some(Command::Migrate { database }) = cli.command {
        anyhow::ensure!(
            database.db_pooler == flotilla_store::Pooler::None,
            "migrations take a session lock and run statements a transaction-mode pooler cannot carry: run `flotilla-worker migrate` against Postgres itself (FLOTILLA_DB_POOLER=none, DATABASE_URL without the pooler)"
        );
        let pool = flotilla_store::connect(&database)
            .await
            .context("connecting to Postgres")?;
        flotilla_store::migrate(&pool)
            .await
            .context("applying migrations")?;
        tracing::info!("migrations applied");
        return Ok(());
    }
    let shutdown = shutdown::on_signal()?;
    let app = Application::build(cli.worker).await.inspect_err(|e| {
        tracing::error!(error = %e, "worker could not start");
    })?;
    app.run_until_stopped(shutdown).await;
    Ok(())
}
