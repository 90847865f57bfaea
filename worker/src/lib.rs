//! `flotilla-worker`: a fleet member. The library holds the run engine
//! ([`engine`]), its stores, targets and workflow definitions, the request
//! consumer ([`consumer`]) and the HTTP API ([`api`]); the binary is a thin
//! shell over [`run`].

pub mod api;
pub mod config;
pub mod consumer;
pub mod db;
pub mod engine;
pub mod kafka;
pub mod shutdown;
pub mod store;
pub mod target;
pub mod telemetry;
pub mod workflow;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

pub use config::WorkerConfig;

/// Runs a worker until `shutdown` is cancelled, then drains in-flight
/// segments within the configured grace period.
///
/// # Errors
/// The database or the broker cannot be reached at start-up, the targets
/// file or a workflow definition is invalid.
pub async fn run(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let worker_id = config.worker_id()?;
    let tokens = api::tokens_from(&config.http.api_tokens);
    anyhow::ensure!(
        !tokens.0.is_empty() || config.http.insecure_no_auth,
        "no API tokens: set FLOTILLA_API_TOKENS, or pass --insecure-no-auth to serve /v1 without auth"
    );
    tracing::info!(%worker_id, "worker starting");
    let mut targets = target::Targets::default();
    if let Some(path) = &config.engine.targets_file {
        target::config::load(path, &mut targets)?;
    }
    tracing::info!(?targets, "targets configured");
    let pool = db::connect(&config.database)
        .await
        .context("connecting to Postgres")?;
    if config.kafka.consume_requests {
        kafka::check_reachable(
            &config.kafka.broker.bootstrap_servers,
            config.kafka.connect_timeout,
        )
        .await
        .context("reaching the Kafka broker")?;
    }

    let engine = engine::Engine::new(
        pool.clone(),
        targets,
        std::sync::Arc::new(engine::SystemClock),
        engine_settings(&worker_id, &config.engine),
    );
    if let Some(dir) = &config.engine.workflows_dir {
        let loaded = engine
            .register_workflows_dir(dir)
            .await
            .with_context(|| format!("registering workflows from {}", dir.display()))?;
        tracing::info!(count = loaded.len(), dir = %dir.display(), "workflows registered");
    }
    let consumer = if config.kafka.consume_requests {
        Some(start_consumer(&engine, &config.kafka, shutdown.clone()).await?)
    } else {
        None
    };
    let api = start_api(&engine, &config, tokens, shutdown.clone()).await?;
    tracing::info!(%worker_id, loops = config.engine.worker_count, "worker ready");
    engine.run(shutdown, config.shutdown_grace).await;
    if let Some(consumer) = consumer {
        // It stops with the same token and commits what is durable.
        if let Err(e) = consumer.await {
            tracing::error!(error = %e, "request consumer task failed");
        }
    }
    if let Err(e) = api.await {
        tracing::error!(error = %e, "API task failed");
    }
    tracing::info!(%worker_id, "worker stopped");
    pool.close().await;
    Ok(())
}

fn engine_settings(worker_id: &str, config: &config::EngineConfig) -> engine::EngineSettings {
    let mut settings = engine::EngineSettings::new(worker_id);
    settings.worker_count = config.worker_count.max(1);
    settings.lease = config.lease;
    settings.backoff_base = config.backoff_base;
    settings.sweep_interval = config.sweep_interval;
    settings.idle_poll_max = config.idle_poll_max;
    settings
}

async fn start_consumer(
    engine: &engine::Engine,
    config: &config::KafkaConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let codec = flotilla_codec::Codec::from_config(config.broker.schema_registry_url.as_deref())
        .context("configuring the schema registry")?;
    let mut settings = consumer::ConsumerSettings::new(
        &config.broker.bootstrap_servers,
        &config.request_topic,
        &config.consumer_group,
    );
    settings.batch_size = config.request_batch_size.max(1);
    settings.batch_wait = config.request_batch_wait;
    settings.max_request_bytes = config.max_request_bytes;
    kafka::ensure_topics(
        &config.broker.bootstrap_servers,
        &[&settings.request_topic, &settings.dead_letter_topic],
        config.topic_partitions,
    )
    .await?;
    let consumer =
        consumer::RequestConsumer::subscribe(engine.clone(), std::sync::Arc::new(codec), settings)?;
    tracing::info!(topic = %config.request_topic, group = %config.consumer_group, "consuming requests");
    Ok(tokio::spawn(consumer.run(shutdown)))
}

async fn start_api(
    engine: &engine::Engine,
    config: &WorkerConfig,
    tokens: api::Tokens,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    if tokens.0.is_empty() {
        tracing::warn!("the API serves /v1 WITHOUT AUTH (--insecure-no-auth)");
    }
    let state = api::ApiState {
        engine: engine.clone(),
        bootstrap_servers: config
            .kafka
            .consume_requests
            .then(|| config.kafka.broker.bootstrap_servers.clone()),
    };
    let router = api::router(state, tokens, config.http.max_body_bytes);
    let listener = tokio::net::TcpListener::bind(config.http.http_addr)
        .await
        .with_context(|| format!("binding the API on {}", config.http.http_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "API listening");
    Ok(tokio::spawn(api::serve(listener, router, shutdown)))
}
