//! An Apache Kafka broker of a test's own: one KRaft node started by
//! `scripts/kafka-node` (the same jars and defaults as the shared broker of
//! `scripts/services`) on free ports with its own storage, for the tests that
//! kill, restart, freeze or secure a broker without disturbing the tests
//! beside them.
//!
//! Readiness is the node's log saying it started and its client port
//! accepting a connection: Kafka binds the port only once the broker is
//! unfenced and serving.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::Running;

/// How long a node may take to serve: a JVM start and a format, about 5 s
/// alone, more beside a loaded test run.
const START_DEADLINE: Duration = Duration::from_secs(120);

/// On every test node's command line (`-Dflotilla.label=…`): `scripts/test`
/// stops the nodes a test killed at its deadline could not.
pub const TEST_LABEL: &str = "flotilla-test-node";

/// `scripts/kafka-node` of this workspace.
#[must_use]
pub fn node_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .join("scripts/kafka-node")
}

/// What a test's broker is started with, beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct KafkaOptions {
    /// Broker settings (`key=value`), over `scripts/kafka-node`'s defaults.
    pub settings: Vec<String>,
    /// Arguments for the storage tool's `format` (SCRAM users).
    pub format_args: Vec<String>,
    /// Listeners beside the plaintext one, as `NAME://host:port`: each is
    /// listened on and advertised as given.
    pub extra_listeners: Vec<String>,
    /// The JVM heap (`scripts/kafka-node`'s default when `None`).
    pub heap: Option<String>,
    /// The plaintext listener's port (a free one when `None`), for a proxy
    /// set up in front of the broker before it starts.
    pub port: Option<u16>,
    /// What the plaintext listener advertises (its own address when
    /// `None`): a proxy's, so every connection goes through it.
    pub advertised: Option<String>,
}

/// A node's place in a cluster of the test's own ([`OwnKafkaCluster`]).
#[derive(Debug, Clone)]
struct Membership {
    node_id: u32,
    /// Every controller, `N@127.0.0.1:C,...`, the same on every node.
    voters: String,
}

impl KafkaOptions {
    /// A broker setting, `key=value`.
    #[must_use]
    pub fn set(mut self, setting: &str) -> Self {
        self.settings.push(setting.to_owned());
        self
    }
}

/// A running node of a test's own; killed when dropped.
#[derive(Debug)]
pub struct OwnKafka {
    /// Its plaintext listener, `127.0.0.1:<port>`: the bootstrap address.
    pub address: String,
    dir: PathBuf,
    port: u16,
    controller_port: u16,
    options: KafkaOptions,
    cluster: Option<Membership>,
    starts_before: usize,
    running: Option<Running>,
}

impl OwnKafka {
    /// Starts a node with the defaults, its storage under `dir`, and returns
    /// once it serves.
    ///
    /// # Panics
    /// The node does not serve within two minutes (its log is shown).
    #[must_use]
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, KafkaOptions::default())
    }

    /// As [`OwnKafka::start`], with `options`.
    ///
    /// # Panics
    /// The node does not serve within two minutes (its log is shown).
    #[must_use]
    pub fn start_with(dir: &Path, options: KafkaOptions) -> Self {
        let mut kafka = Self::unstarted(&dir.join("kafka"), options, crate::free_port());
        kafka.spawn();
        kafka
    }

    fn unstarted(dir: &Path, options: KafkaOptions, controller_port: u16) -> Self {
        let port = options.port.unwrap_or_else(crate::free_port);
        Self {
            address: format!("127.0.0.1:{port}"),
            dir: dir.to_owned(),
            port,
            controller_port,
            options,
            cluster: None,
            starts_before: 0,
            running: None,
        }
    }

    /// [`OwnKafka::start_with`] off the async runtime.
    ///
    /// # Panics
    /// As [`OwnKafka::start_with`].
    pub async fn started(dir: &Path, options: KafkaOptions) -> Self {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || Self::start_with(&dir, options))
            .await
            .expect("starting the test's Kafka broker panicked")
    }

    /// [`OwnKafka::restart`] off the async runtime.
    ///
    /// # Panics
    /// As [`OwnKafka::restart`].
    pub async fn restarted(mut self) -> Self {
        tokio::task::spawn_blocking(move || {
            self.restart();
            self
        })
        .await
        .expect("restarting the test's Kafka broker panicked")
    }

    fn spawn(&mut self) {
        self.launch();
        self.wait_serving();
    }

    /// Starts the node's process without waiting for it: a node of a
    /// cluster serves only once a majority of its controllers runs.
    fn launch(&mut self) {
        let mut command = Command::new(node_script());
        command
            .arg("run")
            .arg(&self.dir)
            .args(["--label", TEST_LABEL])
            .args(["--port", &self.port.to_string()])
            .args(["--controller-port", &self.controller_port.to_string()]);
        if let Some(heap) = &self.options.heap {
            command.args(["--heap", heap]);
        }
        if !self.options.extra_listeners.is_empty() || self.options.advertised.is_some() {
            let listeners = |plaintext: &str| {
                std::iter::once(format!(
                    "PLAINTEXT://{plaintext},CONTROLLER://127.0.0.1:{}",
                    self.controller_port
                ))
                .chain(self.options.extra_listeners.iter().cloned())
                .collect::<Vec<_>>()
                .join(",")
            };
            let advertised = self.options.advertised.as_deref().unwrap_or(&self.address);
            command
                .args(["--set", &format!("listeners={}", listeners(&self.address))])
                .args([
                    "--set",
                    &format!("advertised.listeners={}", listeners(advertised)),
                ]);
        }
        for setting in &self.options.settings {
            command.args(["--set", setting]);
        }
        for arg in &self.options.format_args {
            command.args(["--format-arg", arg]);
        }
        if let Some(cluster) = &self.cluster {
            command
                .args(["--node-id", &cluster.node_id.to_string()])
                .args(["--voters", &cluster.voters]);
        }
        // A restart appends to the same log: only a line after this many
        // starts counts.
        self.starts_before = self.started_lines();
        self.running = Some(Running::start(command));
    }

    /// Waits until the launched node serves.
    fn wait_serving(&mut self) {
        let mut running = self.running.take().expect("the node was launched");
        let deadline = Instant::now() + START_DEADLINE;
        // Ours, not another listener on a port taken since it was chosen:
        // the node says it started, and the port answers.
        while self.started_lines() == self.starts_before
            || std::net::TcpStream::connect(&self.address).is_err()
        {
            if let Some(status) = running.exited() {
                panic!(
                    "the test's Kafka broker exited ({status}) while starting:\n{}\n{}",
                    running.output.join("\n"),
                    self.server_log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the test's Kafka broker did not serve on {} within {START_DEADLINE:?}:\n{}",
                self.address,
                self.server_log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.running = Some(running);
    }

    /// How many times the node's log says it started serving.
    fn started_lines(&self) -> usize {
        std::fs::read_to_string(self.dir.join("logs/server.log"))
            .unwrap_or_default()
            .matches("Kafka Server started")
            .count()
    }

    /// The last lines of the broker's own log, for a failure message.
    #[must_use]
    pub fn server_log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("logs/server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The broker's resident memory in KiB (`VmRSS`), while it runs.
    #[must_use]
    pub fn resident_kib(&self) -> Option<u64> {
        let pid = self.running.as_ref()?.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Kills the broker at once (SIGKILL): no controlled shutdown.
    pub fn kill(&mut self) {
        if let Some(mut running) = self.running.take() {
            running.kill();
        }
    }

    /// Starts the broker again on its storage and ports, after [`kill`]
    /// (or kills it first), and returns once it serves.
    ///
    /// [`kill`]: OwnKafka::kill
    ///
    /// # Panics
    /// It does not serve again within two minutes.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Freezes the broker (SIGSTOP): its connections stay open and nothing
    /// answers, as a broker in a long GC pause or a partitioned host.
    ///
    /// # Panics
    /// The broker is not running.
    pub fn freeze(&self) {
        self.running
            .as_ref()
            .expect("the broker runs")
            .signal("STOP");
    }

    /// Lets a frozen broker go on (SIGCONT).
    ///
    /// # Panics
    /// The broker is not running.
    pub fn thaw(&self) {
        self.running
            .as_ref()
            .expect("the broker runs")
            .signal("CONT");
    }
}

impl Drop for OwnKafka {
    fn drop(&mut self) {
        // `Running`'s own drop kills and reaps without panicking (this may
        // run while a test unwinds).
        drop(self.running.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A cluster of the test's own: `size` combined KRaft nodes (a controller
/// quorum of all of them), each on free ports with its own storage, so a
/// test can kill, restart or freeze a broker of it. Killed when dropped.
#[derive(Debug)]
pub struct OwnKafkaCluster {
    /// Every node's plaintext listener, comma separated.
    pub bootstrap: String,
    /// The nodes, by node id - 1.
    pub nodes: Vec<OwnKafka>,
}

impl OwnKafkaCluster {
    /// Starts `size` nodes at once (one alone never serves: its broker waits
    /// for a quorum) with `options` on each, and returns once all serve.
    ///
    /// # Panics
    /// A node does not serve within two minutes.
    #[must_use]
    pub fn start(dir: &Path, size: u32, options: &KafkaOptions) -> Self {
        let controllers: Vec<u16> = (0..size).map(|_| crate::free_port()).collect();
        let voters = controllers
            .iter()
            .zip(1..)
            .map(|(port, id)| format!("{id}@127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes: Vec<OwnKafka> = controllers
            .iter()
            .zip(1..)
            .map(|(port, node_id)| {
                let mut node = OwnKafka::unstarted(
                    &dir.join(format!("kafka-{node_id}")),
                    options.clone(),
                    *port,
                );
                node.cluster = Some(Membership {
                    node_id,
                    voters: voters.clone(),
                });
                node
            })
            .collect();
        for node in &mut nodes {
            node.launch();
        }
        for node in &mut nodes {
            node.wait_serving();
        }
        let bootstrap = nodes
            .iter()
            .map(|node| node.address.clone())
            .collect::<Vec<_>>()
            .join(",");
        Self { bootstrap, nodes }
    }

    /// [`OwnKafkaCluster::start`] off the async runtime.
    ///
    /// # Panics
    /// As [`OwnKafkaCluster::start`].
    pub async fn started(dir: &Path, size: u32, options: KafkaOptions) -> Self {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || Self::start(&dir, size, &options))
            .await
            .expect("starting the test's Kafka cluster panicked")
    }
}

/// The node id of `group`'s coordinator in the cluster at `bootstrap`, as
/// Kafka's admin client names it (`scripts/kafka-node admin`: librdkafka's
/// admin API does not tell). Blocks.
///
/// # Panics
/// The group is unknown or the cluster does not answer.
#[must_use]
pub fn coordinator_of(bootstrap: &str, group: &str) -> u32 {
    let out = cluster_admin(&["coordinator", bootstrap, group]);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("coordinator of {group}: {out:?}"))
}

/// Moves the leadership of `topic`'s `partition` to another of its
/// replicas as an operator does: a reassignment that puts that replica
/// first (no data moves), then a preferred leader election. Returns the
/// old and the new leader's node ids once the new one leads. Blocks.
///
/// # Panics
/// The move does not happen within a minute.
#[must_use]
pub fn move_leader(bootstrap: &str, topic: &str, partition: i32) -> (u32, u32) {
    let out = cluster_admin(&["move-leader", bootstrap, topic, &partition.to_string()]);
    let ids: Vec<u32> = out
        .split_whitespace()
        .filter_map(|id| id.parse().ok())
        .collect();
    assert_eq!(ids.len(), 2, "move-leader said {out:?}");
    (ids[0], ids[1])
}

fn cluster_admin(args: &[&str]) -> String {
    let output = Command::new(node_script())
        .arg("admin")
        .args(args)
        .output()
        .expect("scripts/kafka-node admin runs");
    assert!(
        output.status.success(),
        "scripts/kafka-node admin {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
