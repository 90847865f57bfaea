use clap::Parser as _;
use flotilla_relay::config::{Cli, Command};
use flotilla_runtime::{shutdown, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let _telemetry = telemetry::init(&cli.telemetry, "flotilla-relay")?;
    if let Some(Command::ReplayFailed { database, job_id }) = cli.command {
        println!(
            "{}",
            flotilla_relay::replay_failed(&database, job_id).await?
        );
        return Ok(());
    }
    let shutdown = shutdown::on_signal()?;
    flotilla_relay::run(&cli.database, cli.relay, shutdown)
        .await
        .inspect_err(|e| tracing::error!(error = %e, "relay stopped"))?;
    Ok(())
}
