//! Building a worker from its settings and running it until it is told to
//! stop: the engine's claim loops, the request consumer and the API, joined
//! under one grace timer.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flotilla_codec::{Codec, CodecError};
use flotilla_contracts::topics;
use flotilla_runtime::identity::{self, BlankIdentity};
use flotilla_runtime::kafka::{self, BrokerError};
use flotilla_runtime::supervise::run_once_or_die;
use rdkafka::error::KafkaError;
use secrecy::ExposeSecret as _;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api;
use crate::config::WorkerConfig;
use crate::engine::{Engine, EngineSettings, Namesake, RegisterError, SwitchError, SystemClock};
use crate::ingest::{ConsumerSettings, KafkaClients, RequestConsumer};
use crate::targets::Targets;
use crate::targets::file::TargetsFileError;
use flotilla_runtime::kafka::lag::{LagReader, LagSource};

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Identity(#[from] BlankIdentity),
    #[error(
        "no API tokens: set FLOTILLA_API_TOKENS, or pass --insecure-no-auth to serve /v1 without auth"
    )]
    NoTokens,
    #[error("FLOTILLA_API_TOKENS: {0}")]
    Tokens(String),
    #[error(transparent)]
    Targets(#[from] TargetsFileError),
    #[error("connecting to Postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error("reaching the Kafka broker: {0}")]
    Broker(#[from] BrokerError),
    #[error("configuring the schema registry: {0}")]
    Registry(#[from] CodecError),
    #[error("registering workflows from {dir}: {source}")]
    Workflows { dir: PathBuf, source: RegisterError },
    #[error("creating the request consumer: {0}")]
    Consumer(#[from] KafkaError),
    #[error(transparent)]
    Namesake(#[from] Namesake),
    #[error(
        "the dead-letter topic {0} does not exist and FLOTILLA_CREATE_TOPICS=false: create it (with the request topic's retention), or let the worker create it"
    )]
    NoDeadLetterTopic(String),
    #[error(
        "the reply topic {0} of a Kafka target, or its dead-letter topic, does not exist and FLOTILLA_CREATE_TOPICS=false: create both, or let the worker create them"
    )]
    NoReplyTopic(String),
    #[error(
        "FLOTILLA_REPLY_CONSUMER_GROUP is {0}, the request consumer's group: the reply consumer needs a group of its own"
    )]
    SameReplyGroup(String),
    #[error("{0}")]
    Membership(String),
    #[error("the run layout switches: {0}")]
    Switches(#[from] SwitchError),
    #[error("binding the API on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A worker ready to run: connected, its topics ensured, its API bound.
#[derive(Debug)]
pub struct Application {
    engine: Engine,
    consumer: Option<RequestConsumer>,
    /// Reads the Kafka targets' replies, in a group of its own; `None`
    /// without Kafka targets or without the request consumer.
    replies: Option<RequestConsumer>,
    readiness: api::readiness::Readiness,
    listener: TcpListener,
    router: axum::Router,
    /// The probes' own listener and router, when configured.
    health: Option<(TcpListener, axum::Router)>,
    server: api::ServerLimits,
    grace: Duration,
}

impl Application {
    /// Connects to Postgres, loads the targets file and builds the worker.
    ///
    /// # Errors
    /// See [`StartupError`]: each names what could not be reached or read.
    pub async fn build(config: WorkerConfig) -> Result<Self, StartupError> {
        // Settings that are wrong on their own fail before anything is reached.
        check_settings(&config)?;
        let mut targets = Targets::default();
        if let Some(path) = &config.engine.targets_file {
            crate::targets::file::load(path, &mut targets)?;
        }
        let pool = flotilla_store::connect(&config.database).await?;
        Self::with_parts(config, pool, targets).await
    }

    /// Builds the worker on an open pool with these targets (in-process ones
    /// included): what [`Application::build`] does after connecting, and
    /// what tests call with their own database.
    ///
    /// # Errors
    /// See [`StartupError`].
    pub async fn with_parts(
        config: WorkerConfig,
        pool: PgPool,
        mut targets: Targets,
    ) -> Result<Self, StartupError> {
        let (worker_id, tokens) = check_settings(&config)?;
        // Kafka targets that name no encoding write the fleet's.
        targets.set_fleet_encoding(if config.broker.registry.schema_registry_url.is_some() {
            crate::targets::kafka::Encoding::Avro
        } else {
            crate::targets::kafka::Encoding::Json
        });
        tracing::info!(%worker_id, ?targets, "worker starting");
        // Installed before anything is counted, so no early count is lost.
        let _ = flotilla_runtime::metrics::prometheus();
        let engine = Engine::new(
            pool,
            targets,
            Arc::new(SystemClock),
            engine_settings(&worker_id, &config),
        );
        // Never beside a live worker of the same id; without a database the
        // worker still starts (its API answers 503).
        match engine.refuse_a_live_namesake().await {
            Err(Namesake::Store(e)) => {
                tracing::warn!(error = %e, "could not check for a live worker of this id");
            }
            other => other?,
        }
        // Announced before the switches are decided, so that another worker
        // deciding now sees this one. Without a database the worker still
        // starts (its API answers 503); the sweeper decides them later.
        let announced = engine.announce().await.map_err(SwitchError::Store);
        match announced.and(engine.settle_switches(true).await) {
            Err(SwitchError::Store(e)) => {
                tracing::warn!(error = %e, "the run layout switches wait for the database");
            }
            other => other?,
        }
        if let Some(dir) = &config.engine.workflows_dir {
            let loaded = engine.register_workflows_dir(dir).await.map_err(|source| {
                StartupError::Workflows {
                    dir: dir.clone(),
                    source,
                }
            })?;
            tracing::info!(count = loaded.len(), dir = %dir.display(), "workflows registered");
        }
        let (consumer, replies) = if config.consumer.consume_requests {
            let (consumer, replies) = subscribe(&engine, &config, &worker_id).await?;
            (Some(consumer), replies)
        } else {
            (None, None)
        };
        if tokens.is_empty() {
            tracing::warn!("the API serves /v1 WITHOUT AUTH (--insecure-no-auth)");
        }
        let consumers = [
            ("request consumer", &consumer),
            ("reply consumer", &replies),
        ]
        .into_iter()
        .filter_map(|(name, c)| c.as_ref().map(|c| (name, c.health())))
        .collect();
        let readiness = api::readiness::Readiness::new(
            engine.clone(),
            consumers,
            *config.consumer.paused_unready_after,
        );
        readiness.ping().await;
        let hosts = api::ServedHosts::new(&config.http.http_allowed_hosts, tokens.is_empty());
        let state = api::ApiState {
            engine: engine.clone(),
            readiness: readiness.clone(),
            tokens,
            inline_definitions: config.http.inline_definitions,
            lag: config.consumer.consume_requests.then(|| {
                LagReader::new(LagSource {
                    broker: config.broker.clone(),
                    group: config.consumer.consumer_group.clone(),
                    topic: config.consumer.request_topic.clone(),
                })
            }),
        };
        let health = match config.http.health_addr {
            Some(addr) => {
                let listener = TcpListener::bind(addr)
                    .await
                    .map_err(|source| StartupError::Bind { addr, source })?;
                Some((listener, api::health_router(state.clone())))
            }
            None => None,
        };
        let router = api::router(
            state,
            api::RouterSettings {
                body_limit: config.http.max_body_bytes,
                request_timeout: *config.http.http_request_timeout,
                hosts,
            },
        );
        let addr = config.http.listen_addr();
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartupError::Bind { addr, source })?;
        Ok(Self {
            engine,
            consumer,
            replies,
            readiness,
            listener,
            router,
            health,
            server: api::ServerLimits {
                header_read_timeout: *config.http.http_header_read_timeout,
                request_timeout: *config.http.http_request_timeout,
                max_connections: config.http.http_max_connections,
            },
            grace: *config.shutdown_grace,
        })
    }

    /// Where the API listens (the real port when configured with port 0).
    ///
    /// # Panics
    /// The bound socket has no address (it always has).
    #[must_use]
    pub fn api_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Where the probes' own listener is, when one is configured.
    #[must_use]
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health
            .as_ref()
            .and_then(|(listener, _)| listener.local_addr().ok())
    }

    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Runs until `shutdown`, then stops claiming, consuming and accepting,
    /// and gives in-flight work the grace period, all three together. What
    /// is still running then is abandoned: segments to their leases, the
    /// consumer's uncommitted batch to redelivery, API calls to their clients.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) {
        let Self {
            engine,
            consumer,
            replies,
            readiness,
            listener,
            router,
            health,
            server,
            grace,
        } = self;
        tokio::spawn(readiness.keep_fresh(shutdown.clone()));
        tracing::info!(api = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            loops = engine.settings().claim_loops, "worker ready");
        let api = tokio::spawn(api::serve(listener, router, server, shutdown.clone()));
        // The probes answer until the process exits, through the grace.
        let probes = CancellationToken::new();
        if let Some((listener, router)) = health {
            tokio::spawn(api::serve(
                listener,
                router,
                api::server::HEALTH_LIMITS,
                probes.clone(),
            ));
        }
        let _stop_probes = probes.drop_guard();
        let (consumer, clients) = supervise(&engine, consumer, "request consumer", &shutdown);
        let (replies, reply_clients) = supervise(&engine, replies, "reply consumer", &shutdown);
        let claims = {
            let (engine, shutdown) = (engine.clone(), shutdown.clone());
            tokio::spawn(async move { engine.run(shutdown, grace).await })
        };
        shutdown.cancelled().await;
        let deadline = tokio::time::Instant::now() + grace;
        // The claim loops get the time to hand back what the grace did not
        // see finish, and to leave the fleet, before they are abandoned.
        finish_by(deadline + engine.wind_down(), "claim loops", claims).await;
        if let Some(consumer) = consumer {
            finish_by(deadline, "request consumer", consumer).await;
        }
        if let Some(replies) = replies {
            finish_by(deadline, "reply consumer", replies).await;
        }
        finish_by(deadline, "API", api).await;
        // The consumers leave their groups while the pool closes; both are
        // bounded. Closing the pool waits for every connection to come
        // back; one stuck on a dead link must not keep the process from
        // exiting.
        let kafka = KafkaClients::release_all([clients, reply_clients].into_iter().flatten());
        let database = async {
            if tokio::time::timeout(Duration::from_secs(5), engine.close())
                .await
                .is_err()
            {
                tracing::warn!("database connections still busy at exit; leaving them");
            }
        };
        tokio::join!(kafka, database);
        tracing::info!(worker_id = %engine.settings().worker_id, "worker stopped");
    }
}

/// The worker id and the API tokens, or why the settings cannot work.
fn check_settings(config: &WorkerConfig) -> Result<(String, api::Tokens), StartupError> {
    let worker_id = identity::resolve(config.worker_id.as_deref())?;
    let tokens = api::Tokens::parse(config.http.api_tokens.as_ref().map(|t| t.expose_secret()))
        .map_err(StartupError::Tokens)?;
    if tokens.is_empty() && !config.http.insecure_no_auth {
        return Err(StartupError::NoTokens);
    }
    if config.consumer.consume_requests {
        config.broker.validate().map_err(BrokerError::Settings)?;
        config
            .consumer
            .group_protocol
            .check(&config.broker.security)
            .map_err(BrokerError::Settings)?;
    }
    if let Some(group) = &config.consumer.reply_consumer_group
        && *group == config.consumer.consumer_group
    {
        return Err(StartupError::SameReplyGroup(group.clone()));
    }
    config
        .consumer
        .membership()
        .map_err(StartupError::Membership)?;
    Ok((worker_id, tokens))
}

/// Runs `consumer` (when there is one) in a task whose end stops the
/// worker; the task, and a hold on its clients to release off the runtime.
fn supervise(
    engine: &Engine,
    consumer: Option<RequestConsumer>,
    what: &str,
    shutdown: &CancellationToken,
) -> (Option<JoinHandle<()>>, Option<KafkaClients>) {
    let Some(consumer) = consumer else {
        return (None, None);
    };
    let clients = consumer.clients();
    let stop = shutdown.clone();
    let run = async move {
        consumer.run(stop).await;
    };
    let supervised = run_once_or_die(engine.health().clone(), what.into(), run);
    (Some(tokio::spawn(supervised)), Some(clients))
}

/// Waits for `task` until `deadline`, then aborts it.
async fn finish_by<T>(deadline: tokio::time::Instant, what: &str, mut task: JoinHandle<T>) {
    match tokio::time::timeout_at(deadline, &mut task).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "{what} task failed"),
        Err(_) => {
            tracing::warn!("{what} still busy at the end of the grace period; abandoning it");
            task.abort();
        }
    }
}

fn engine_settings(worker_id: &str, config: &WorkerConfig) -> EngineSettings {
    let engine = &config.engine;
    let mut settings = EngineSettings::new(worker_id);
    settings.claim_loops = engine.worker_count;
    settings.reserved_connections = engine.db_reserved_connections;
    settings.lease = *engine.lease;
    settings.max_lease_losses = engine.max_lease_losses;
    settings.missing_target_wait = *engine.missing_target_wait;
    settings.backoff_base = *engine.backoff_base;
    settings.backoff_max = *engine.backoff_max;
    settings.sweep_interval = *engine.sweep_interval;
    settings.idle_poll_max = *engine.idle_poll_max;
    settings.listen_for_work = engine.listen_for_work;
    settings.eager_start = engine.eager_start;
    settings.max_event_bytes = engine.max_event_bytes;
    settings.max_stored_bytes = engine.max_stored_bytes;
    settings.max_family_jobs = engine.max_family_jobs;
    settings.definition_by_reference = engine.definition_by_reference;
    settings.checkpoint_rows = engine.checkpoint_rows;
    let retention = &engine.retention;
    settings.retention = crate::engine::services::retention::RetentionSettings {
        enabled: retention.retention,
        keep_completed: *retention.retain_completed,
        keep_failed: *retention.retain_failed,
        keep_cancelled: *retention.retain_cancelled,
        by_workflow: retention.retain_by_workflow.0.clone(),
        removed_horizon: *retention.removed_id_horizon,
        batch: retention.retention_batch,
        interval: *retention.retention_interval,
    };
    settings.expression_budget = crate::workflow::Budget {
        steps: engine.expression_max_steps,
        bytes: engine.expression_max_bytes,
        time: *engine.expression_timeout,
    };
    settings
}

/// Checks the broker, ensures the request and dead-letter topics, subscribes
/// the request consumer, and the reply consumer when there are Kafka targets.
async fn subscribe(
    engine: &Engine,
    config: &WorkerConfig,
    worker_id: &str,
) -> Result<(RequestConsumer, Option<RequestConsumer>), StartupError> {
    let consumer = &config.consumer;
    kafka::check_reachable(&config.broker, *consumer.connect_timeout).await?;
    let codec = Codec::from_config(&config.broker.registry)?;
    let mut settings = ConsumerSettings::new(
        config.broker.clone(),
        &consumer.request_topic,
        &consumer.consumer_group,
    );
    settings.batch_size = consumer.request_batch_size.max(1);
    settings.batch_wait = *consumer.request_batch_wait;
    settings.batch_bytes = consumer.request_batch_bytes;
    let static_member = consumer.membership().map_err(StartupError::Membership)?;
    settings.group_instance_id = static_member.then(|| worker_id.to_owned());
    settings.group_protocol = consumer.group_protocol;
    settings.max_request_bytes = consumer.max_request_bytes;
    settings.signal_topic = Some(consumer.signal_topic.clone()).filter(|t| !t.trim().is_empty());
    let reply_topics = engine.targets().reply_topics();
    let mut wanted = vec![
        settings.request_topic.clone(),
        settings.dead_letter_topic.clone(),
    ];
    if let Some(signals) = &settings.signal_topic {
        wanted.extend([signals.clone(), topics::dead_letter_topic(signals)]);
    }
    // The Kafka targets' topics: requests (the relay writes them, the
    // services read them), replies and their dead letters.
    wanted.extend(engine.targets().request_topics());
    for reply in &reply_topics {
        wanted.extend([reply.clone(), topics::dead_letter_topic(reply)]);
    }
    let wanted: Vec<&str> = wanted.iter().map(String::as_str).collect();
    let missing = kafka::ensure_topics(&config.broker, &wanted, consumer.topics).await?;
    // Without its dead-letter topic every bad message would pause its
    // partition: refuse to start instead, naming it.
    if missing.contains(&settings.dead_letter_topic) {
        return Err(StartupError::NoDeadLetterTopic(
            settings.dead_letter_topic.clone(),
        ));
    }
    // Signals from Kafka are optional: a deployment that creates its topics
    // itself and has not made these yet still runs, and says so.
    if let Some(signals) = settings.signal_topic.clone() {
        let dead = topics::dead_letter_topic(&signals);
        if missing.contains(&signals) || missing.contains(&dead) {
            tracing::warn!(topic = %signals, dead_letters = %dead,
                "the signal topic or its dead-letter topic does not exist: signals are not read from Kafka (create both, or set FLOTILLA_SIGNAL_TOPIC= to say so)");
            settings.signal_topic = None;
        }
    }
    // A reply topic that does not exist would leave its steps waiting
    // until they time out: refuse to start instead, naming it.
    if let Some(reply) = reply_topics.iter().find(|reply| {
        missing.contains(*reply) || missing.contains(&topics::dead_letter_topic(reply))
    }) {
        return Err(StartupError::NoReplyTopic(reply.clone()));
    }
    // Topics that exist but refuse writes (fewer replicas than their
    // min.insync.replicas) are named in readiness; one partition on the
    // request topic is warned about.
    for problem in
        kafka::unfit_topics(&config.broker, &wanted, &[settings.request_topic.as_str()]).await?
    {
        engine.health().unfit("Kafka topics", problem);
    }
    let codec = Arc::new(codec);
    let replies = if reply_topics.is_empty() {
        None
    } else {
        let group = consumer
            .reply_consumer_group
            .clone()
            .unwrap_or_else(|| format!("{}-replies", settings.group));
        let mut replies = settings.for_replies(&group);
        replies.reply_topics = reply_topics;
        tracing::info!(topics = ?replies.reply_topics, group = %replies.group, "consuming replies");
        Some(RequestConsumer::subscribe(
            engine.clone(),
            codec.clone(),
            replies,
        )?)
    };
    tracing::info!(topic = %settings.request_topic, signals = ?settings.signal_topic, group = %settings.group, "consuming requests");
    let requests = RequestConsumer::subscribe(engine.clone(), codec, settings)?;
    Ok((requests, replies))
}
