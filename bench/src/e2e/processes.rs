//! The broker and the fleet of processes an end-to-end run starts, and
//! what it reads back from them.

use super::*;

/// A broker with the run's topics on it.
pub(super) struct Broker {
    pub(super) bootstrap: String,
    pub(super) _mock: Option<MockCluster<'static, DefaultProducerContext>>,
}

impl Broker {
    pub(super) async fn start(kind: BrokerKind, topics: &[&str]) -> anyhow::Result<Self> {
        match kind {
            BrokerKind::Mock => {
                let cluster = MockCluster::new(1)?;
                for topic in topics {
                    cluster.create_topic(topic, PARTITIONS, 1)?;
                }
                Ok(Self {
                    bootstrap: cluster.bootstrap_servers(),
                    _mock: Some(cluster),
                })
            }
            BrokerKind::Kafka => {
                for topic in topics {
                    flotilla_tests::create_topic(topic, PARTITIONS).await?;
                }
                Ok(Self {
                    bootstrap: flotilla_tests::bootstrap_servers(),
                    _mock: None,
                })
            }
        }
    }
}

/// The workflows and the targets they call, in a directory of their own:
/// the demo target over HTTP (`bench`) and over a pair of Kafka topics
/// (`benchk`, `step_topics`: requests, replies).
pub(super) fn write_fleet_files(
    dir: &Path,
    target: &str,
    step_topics: (&str, &str),
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("workflows"))?;
    let (step_requests, step_replies) = step_topics;
    std::fs::write(
        dir.join("targets.yaml"),
        format!(
            "targets:\n  bench:\n    kind: http\n    base_url: {target}\n  benchk:\n    kind: kafka\n    request_topic: {step_requests}\n    reply_topic: {step_replies}\n    timeout_ms: 60000\n"
        ),
    )?;
    let kafka = json!({"name": KAFKA_WORKFLOW, "input_schema": {},
        "steps": [{"name": "step1", "target": "benchk", "method": "score", "rules": ["amount = 1"]}]});
    std::fs::write(
        dir.join(format!("workflows/{KAFKA_WORKFLOW}.json")),
        kafka.to_string(),
    )?;
    for (name, steps) in [("bench3", 3), ("bench1", 1)] {
        let steps: Vec<_> = (1..=steps)
            .map(|n| json!({"name": format!("step{n}"), "target": "bench", "method": "lookup"}))
            .collect();
        let workflow = json!({"name": name, "input_schema": {}, "steps": steps});
        std::fs::write(
            dir.join(format!("workflows/{name}.json")),
            workflow.to_string(),
        )?;
    }
    Ok(())
}

/// When a job's COMPLETED event was committed (its `occurred_at`) and read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Completion {
    pub(super) read: Instant,
    pub(super) read_wall: chrono::DateTime<chrono::Utc>,
    pub(super) committed: chrono::DateTime<chrono::Utc>,
    /// When its row was committed (its ACCEPTED event's `occurred_at`).
    pub(super) accepted: Option<chrono::DateTime<chrono::Utc>>,
    /// When the relay handed the COMPLETED event to its producer (the
    /// record's create time, which the producer stamps).
    pub(super) sent: Option<chrono::DateTime<chrono::Utc>>,
}

/// When a request was handed to the producer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sent {
    pub(super) at: Instant,
    pub(super) wall: chrono::DateTime<chrono::Utc>,
}

/// What a fleet is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Workers with their claim loops, and a relay: the whole path.
    Run,
    /// Workers with no claim loops and no relay: ingestion alone.
    IngestOnly,
}

/// One fleet: its database, broker, topics and processes.
pub(super) struct Fleet {
    pub(super) database: ScratchDatabase,
    pub(super) broker: Broker,
    pub(super) requests: String,
    pub(super) events: String,
    pub(super) group: String,
    pub(super) workers: Vec<Running>,
    pub(super) relay: Option<Running>,
    pub(super) target: Running,
    pub(super) dir: PathBuf,
}

impl Fleet {
    pub(super) async fn start(
        kind: BrokerKind,
        workers: usize,
        role: Role,
    ) -> anyhow::Result<Self> {
        Self::start_on_history(kind, workers, role, 0).await
    }

    /// [`Fleet::start`] on a database that already holds `expired`
    /// COMPLETED runs past their retention (8 days old), which the
    /// workers' retention removes as it would in production (a pass every
    /// 10 s, the defaults).
    pub(super) async fn start_on_history(
        kind: BrokerKind,
        workers: usize,
        role: Role,
        expired: i64,
    ) -> anyhow::Result<Self> {
        let run = Uuid::new_v4().simple().to_string();
        let (requests, events) = (
            format!("bench-requests-{run}"),
            format!("bench-events-{run}"),
        );
        let group = format!("bench-workers-{run}");
        // The workers create no topics: the dead-letter topic is made here
        // with the others (a worker refuses to start without it).
        let dead_letters = flotilla_contracts::topics::dead_letter_topic(&requests);
        let (step_requests, step_replies) = (
            format!("bench-step-requests-{run}"),
            format!("bench-step-replies-{run}"),
        );
        let reply_dead_letters = flotilla_contracts::topics::dead_letter_topic(&step_replies);
        let broker = Broker::start(
            kind,
            &[
                &requests,
                &dead_letters,
                &events,
                &step_requests,
                &step_replies,
                &reply_dead_letters,
            ],
        )
        .await?;
        let database = ScratchDatabase::create("bench_e2e", 2).await?;
        if expired > 0 {
            crate::engine::history(&database.pool, expired, 8).await?;
        }
        let dir = std::env::temp_dir().join(format!("flotilla-bench-{run}"));
        let port = flotilla_tests::free_port();
        let target_addr = format!("127.0.0.1:{port}");
        write_fleet_files(
            &dir,
            &format!("http://{target_addr}"),
            (&step_requests, &step_replies),
        )?;
        // The same service answers the Kafka target's requests.
        let mut target = Command::new(workspace_binary("flotilla-demo-target"));
        target
            .env("DEMO_TARGET_ADDR", &target_addr)
            .env("DEMO_TARGET_LATENCY", "0ms")
            .env("DEMO_TARGET_KAFKA_REQUESTS", &step_requests)
            .env("KAFKA_BOOTSTRAP_SERVERS", &broker.bootstrap)
            .env_remove("SCHEMA_REGISTRY_URL")
            .env("RUST_LOG", "warn");
        let common = |command: &mut Command| {
            command
                .env("DATABASE_URL", database.url())
                .env("KAFKA_BOOTSTRAP_SERVERS", &broker.bootstrap)
                .env("SCHEMA_REGISTRY_URL", "")
                .env("FLOTILLA_CREATE_TOPICS", "false")
                .env("RUST_LOG", "warn,flotilla_worker=info,flotilla_engine=info,flotilla_ingest=info,flotilla_relay=info")
                .env("NO_COLOR", "1");
        };
        let mut commands = Vec::new();
        for n in 0..workers {
            let mut worker = Command::new(workspace_binary("flotilla-worker"));
            common(&mut worker);
            // As for the reader: the mock cluster holds an empty fetch for
            // the whole wait, where Kafka answers as soon as a record
            // arrives; Kafka's workers run with the defaults.
            if kind == BrokerKind::Mock {
                worker.args(["--kafka-property", "fetch.wait.max.ms=10"]);
            }
            worker
                .env("FLOTILLA_WORKER_ID", format!("bench-worker-{n}"))
                .env("FLOTILLA_HTTP_ADDR", "127.0.0.1:0")
                .env("FLOTILLA_API_TOKENS", "bench")
                .env("FLOTILLA_REQUEST_TOPIC", &requests)
                .env("FLOTILLA_CONSUMER_GROUP", &group)
                .env("FLOTILLA_TARGETS_FILE", dir.join("targets.yaml"))
                .env("FLOTILLA_WORKFLOWS_DIR", dir.join("workflows"));
            if role == Role::IngestOnly {
                worker.env("FLOTILLA_WORKER_COUNT", "0");
            }
            commands.push(worker);
        }
        let mut relay = Command::new(workspace_binary("flotilla-relay"));
        common(&mut relay);
        relay
            .env("FLOTILLA_EVENT_TOPIC", &events)
            .env("FLOTILLA_RELAY_ID", "bench-relay")
            .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0");
        let (target, workers, relay) = tokio::task::spawn_blocking(move || {
            let mut target = Running::start(target);
            target.wait_for_line("demo target listening", Duration::from_secs(30));
            let workers: Vec<Running> = commands
                .into_iter()
                .map(|command| {
                    let mut worker = Running::start(command);
                    worker.wait_for_line("worker ready", Duration::from_secs(60));
                    worker
                })
                .collect();
            let relay = (role == Role::Run).then(|| {
                let mut relay = Running::start(relay);
                relay.wait_for_line("relay ready", Duration::from_secs(60));
                relay
            });
            (target, workers, relay)
        })
        .await?;
        Ok(Self {
            database,
            broker,
            requests,
            events,
            group,
            workers,
            relay,
            target,
            dir,
        })
    }

    /// Whether the workers' group has committed every partition of the
    /// request topic to its end.
    pub(super) async fn committed_to_end(&self) -> anyhow::Result<bool> {
        let source = LagSource {
            broker: BrokerConfig::new(&self.broker.bootstrap),
            group: self.group.clone(),
            topic: self.requests.clone(),
        };
        let partitions = lag::read(&source, Duration::from_secs(10)).await?;
        anyhow::ensure!(
            partitions.len() == PARTITIONS as usize,
            "the request topic has {} partitions, not {PARTITIONS}",
            partitions.len()
        );
        Ok(partitions.iter().all(|p| p.lag == 0))
    }

    pub(super) fn producer(&self) -> anyhow::Result<FutureProducer> {
        Ok(BrokerConfig::new(&self.broker.bootstrap)
            .idempotent_producer()
            .set("queue.buffering.max.ms", "5")
            .create()?)
    }

    /// Reads COMPLETED events until every job of `jobs` has one; returns
    /// when each arrived. It reads from the event topic's end as it is when
    /// called: what an earlier run of the same fleet published is not read
    /// (read from the start, the events of the throughput run before the
    /// latency run, 25,000 to 100,000 of them, held the first paced jobs'
    /// events back while the reader caught up: they were the p99).
    pub(super) async fn read_completed(
        &self,
        jobs: HashSet<Uuid>,
        deadline: Duration,
    ) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<HashMap<Uuid, Completion>>>> {
        let consumer: StreamConsumer = BrokerConfig::new(&self.broker.bootstrap)
            .manual_commit_consumer(&format!("bench-reader-{}", Uuid::new_v4()))
            // The mock cluster answers a fetch with nothing new only after
            // this wait, even when records arrive meanwhile: keep it short.
            .set("fetch.wait.max.ms", "10")
            .create()?;
        let events = self.events.clone();
        let (consumer, ends) = tokio::task::spawn_blocking(move || {
            let ends = (0..PARTITIONS)
                .map(|partition| {
                    consumer
                        .fetch_watermarks(&events, partition, Duration::from_secs(10))
                        .map(|(_, high)| (partition, high))
                })
                .collect::<Result<Vec<_>, _>>();
            (consumer, ends)
        })
        .await?;
        let ends = ends?;
        let mut assignment = rdkafka::TopicPartitionList::new();
        for (partition, end) in ends {
            assignment.add_partition_offset(
                &self.events,
                partition,
                rdkafka::Offset::Offset(end),
            )?;
        }
        consumer.assign(&assignment)?;
        Ok(tokio::spawn(async move {
            let stop = Instant::now() + deadline;
            let mut done = HashMap::with_capacity(jobs.len());
            // A job's events share a partition, so ACCEPTED comes first.
            let mut accepted = HashMap::with_capacity(jobs.len());
            while done.len() < jobs.len() {
                let left = stop.saturating_duration_since(Instant::now());
                let message =
                    tokio::time::timeout(left, consumer.recv())
                        .await
                        .map_err(|_| {
                            anyhow::anyhow!(
                                "only {} of {} jobs COMPLETED in time",
                                done.len(),
                                jobs.len()
                            )
                        })??;
                let Some(payload) = message.payload() else {
                    continue;
                };
                let event = flotilla_contracts::json::decode::<WorkflowRunEvent>(payload)?;
                if event.event_type() == WorkflowRunEventType::Accepted {
                    accepted.insert(event.job_id(), event.occurred_at());
                }
                if event.event_type() == WorkflowRunEventType::Completed
                    && jobs.contains(&event.job_id())
                {
                    done.entry(event.job_id()).or_insert_with(|| Completion {
                        read: Instant::now(),
                        read_wall: chrono::Utc::now(),
                        committed: event.occurred_at(),
                        accepted: accepted.get(&event.job_id()).copied(),
                        sent: message
                            .timestamp()
                            .to_millis()
                            .and_then(chrono::DateTime::from_timestamp_millis),
                    });
                }
            }
            Ok(done)
        }))
    }

    /// Produces a request of `workflow` for each of `jobs`, `pace` apart
    /// (none: as fast as the producer takes them); returns when each was
    /// handed over.
    pub(super) async fn produce(
        &self,
        workflow: &str,
        jobs: &[Uuid],
        pace: Option<Duration>,
    ) -> anyhow::Result<HashMap<Uuid, Sent>> {
        let producer = self.producer()?;
        let mut sent = HashMap::with_capacity(jobs.len());
        let mut deliveries = Vec::with_capacity(jobs.len());
        let started = Instant::now();
        for (n, job) in jobs.iter().enumerate() {
            if let Some(pace) = pace {
                let due = started + pace.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
                tokio::time::sleep_until(due.into()).await;
            }
            let request = WorkflowRunRequest::new(*job, workflow, json!({"n": n}))?;
            let payload = flotilla_contracts::json::encode(&request)?;
            let key = request.job_id().to_string();
            let record = FutureRecord::to(&self.requests).key(&key).payload(&payload);
            deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
            sent.insert(
                request.job_id(),
                Sent {
                    at: Instant::now(),
                    wall: chrono::Utc::now(),
                },
            );
        }
        for delivery in deliveries {
            delivery.await?.map_err(|(e, _)| e)?;
        }
        Ok(sent)
    }

    /// Peak resident memory of the first worker and of the relay, in MiB.
    pub(super) fn peak_rss_mib(&self) -> (f64, f64) {
        let mib = |kib: Option<u64>| kib.map_or(0.0, |k| k as f64 / 1024.0);
        (
            mib(self.workers[0].peak_rss_kib()),
            mib(self.relay.as_ref().and_then(Running::peak_rss_kib)),
        )
    }

    pub(super) async fn stop(self) -> anyhow::Result<()> {
        let Self {
            database,
            workers,
            relay,
            target,
            dir,
            broker,
            ..
        } = self;
        let logs = dir.join("logs");
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&logs)?;
            let names = (0..workers.len())
                .map(|n| format!("worker-{n}"))
                .chain(relay.as_ref().map(|_| "relay".to_owned()))
                .chain(["target".to_owned()]);
            let processes = workers.into_iter().chain(relay).chain([target]);
            for (name, mut process) in names.zip(processes) {
                process.terminate(Duration::from_secs(30));
                std::fs::write(logs.join(format!("{name}.log")), process.output.join("\n"))?;
            }
            Ok(())
        })
        .await??;
        drop(broker);
        database.drop_now().await?;
        // The processes' output stays for a look when asked for.
        if std::env::var_os("FLOTILLA_BENCH_KEEP_LOGS").is_some() {
            println!("bench: logs in {}", dir.join("logs").display());
        } else {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    }
}
