use anyhow::Context as _;
use clap::Parser as _;
use flotilla_runtime::{shutdown, telemetry};
use flotilla_worker::Application;
use flotilla_worker::config::{Cli, Command, OffsetsCommand, SetOffsets};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let _telemetry = telemetry::init(&cli.worker.telemetry, "flotilla-worker")?;
    match cli.command {
        Some(Command::Migrate { database }) => return migrate(&database).await,
        Some(Command::Offsets {
            action: OffsetsCommand::Set(args),
        }) => return set_offsets(&args).await,
        None => {}
    }
    let shutdown = shutdown::on_signal()?;
    let app = Application::build(cli.worker).await.inspect_err(|e| {
        tracing::error!(error = %e, "worker could not start");
    })?;
    app.run_until_stopped(shutdown).await;
    Ok(())
}

async fn migrate(database: &flotilla_store::DatabaseConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        database.db_pooler == flotilla_store::Pooler::None,
        "migrations take a session lock and run statements a transaction-mode pooler cannot carry: run `flotilla-worker migrate` against Postgres itself (FLOTILLA_DB_POOLER=none, DATABASE_URL without the pooler)"
    );
    let pool = flotilla_store::connect(database)
        .await
        .context("connecting to Postgres")?;
    flotilla_store::migrate(&pool)
        .await
        .context("applying migrations")?;
    tracing::info!("migrations applied");
    Ok(())
}

/// `offsets set`: one line per partition moved.
async fn set_offsets(args: &SetOffsets) -> anyhow::Result<()> {
    let moved = flotilla_worker::group_offsets::set(args).await?;
    let shown = |offset: Option<i64>| offset.map_or_else(|| "none".to_owned(), |o| o.to_string());
    for m in moved {
        println!(
            "{}/{}: group {} now at {} (Kafka had {}, the database {})",
            args.topic,
            m.partition,
            args.group,
            m.now,
            shown(m.kafka_before),
            shown(m.database_before)
        );
    }
    Ok(())
}
