use anyhow::Context as _;
use clap::Parser as _;
use flotilla_relay::Relay;
use flotilla_relay::config::{Cli, Command};
use flotilla_worker::engine::SystemClock;
use flotilla_worker::store::outbox;
use flotilla_worker::{db, kafka, shutdown, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(&cli.telemetry)?;
    if let Some(Command::ReplayFailed { database, job_id }) = cli.command {
        let pool = db::connect(&database)
            .await
            .context("connecting to Postgres")?;
        let mut conn = pool.acquire().await?;
        let replayed = outbox::replay_failed(&mut conn, job_id, chrono::Utc::now()).await?;
        tracing::info!(replayed, "FAILED outbox rows put back to PENDING");
        println!("{replayed}");
        return Ok(());
    }
    let (database, args) = (cli.database, cli.relay);
    let shutdown = shutdown::on_signal()?;
    let pool = db::connect(&database)
        .await
        .context("connecting to Postgres")?;
    kafka::check_reachable(
        &args.broker.bootstrap_servers,
        std::time::Duration::from_secs(10),
    )
    .await
    .context("reaching the Kafka broker")?;
    kafka::ensure_topics(
        &args.broker.bootstrap_servers,
        &[&args.event_topic],
        args.topic_partitions,
    )
    .await?;
    let grace = args.shutdown_grace;
    let relay = Relay::new(pool.clone(), std::sync::Arc::new(SystemClock), args.into())?;
    tracing::info!("relay ready");
    relay.run(shutdown, grace).await;
    tracing::info!("relay stopped");
    pool.close().await;
    Ok(())
}
