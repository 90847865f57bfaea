use anyhow::Context as _;
use clap::Parser as _;
use flotilla_worker::config::{Cli, Command};
use flotilla_worker::{db, shutdown, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(&cli.worker.telemetry)?;
    match cli.command {
        Some(Command::Migrate { database }) => {
            let pool = db::connect(&database)
                .await
                .context("connecting to Postgres")?;
            db::migrate(&pool).await.context("applying migrations")?;
            tracing::info!("migrations applied");
            Ok(())
        }
        None => {
            let shutdown = shutdown::on_signal()?;
            let result = flotilla_worker::run(cli.worker, shutdown).await;
            if let Err(e) = &result {
                tracing::error!(error = format!("{e:#}"), "worker stopped");
            }
            result
        }
    }
}
