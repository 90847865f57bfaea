//! How an engine behaves: [`EngineSettings`] and the default of each
//! setting, as docs/operations.md lists them.

use std::time::Duration;

use crate::Switch;
use crate::nodes::child::DEFAULT_MAX_FAMILY_JOBS;
use crate::services::retention::RetentionSettings;
use crate::support::stored_bytes::DEFAULT_MAX_STORED_BYTES;

/// Lease a claim holds without renewal, unless configured: short, so a
/// killed worker's jobs resume within about 30 s (lease plus a sweep).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(20);
/// How long a job may wait for a worker that has its targets, unless configured.
pub const DEFAULT_MISSING_TARGET_WAIT: Duration = Duration::from_secs(15 * 60);
/// How many lapsed leases in a row send a job DEAD, unless configured.
pub const DEFAULT_MAX_LEASE_LOSSES: i32 = 3;
/// Base of the retry backoff, unless configured.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(5);
/// The longest pause between a job's attempts, unless configured.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Claim loops per process, unless configured. Their checkpoints share
/// commits (`group_commit`), so more loops add jobs in flight, not commits:
/// 16 ran 1.7× the jobs/s of 4 on a 2-core machine.
pub const DEFAULT_CLAIM_LOOPS: usize = 16;
/// How often the sweeper looks for lapsed leases, unless configured.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Most rows one sweep touches.
pub const DEFAULT_SWEEP_BATCH: i64 = 100;
/// Longest an idle claim loop waits before polling again, unless configured.
pub const DEFAULT_IDLE_POLL_MAX: Duration = Duration::from_millis(500);
/// First wait of an idle claim loop; it doubles up to the maximum.
pub const DEFAULT_IDLE_POLL_MIN: Duration = Duration::from_millis(10);
/// Connections reserved for lease renewals and fenced writes, unless
/// configured: one carries the group commit, the rest the heartbeats.
pub const DEFAULT_RESERVED_CONNECTIONS: u32 = 4;

/// A member not seen for this long is left out of the fleet (workers and
/// relays refresh their rows every few seconds).
pub const MEMBER_TTL: Duration = Duration::from_secs(60);

/// How an engine behaves; defaults as listed in docs/operations.md.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Lease owner written on claimed rows; never blank.
    pub worker_id: String,
    /// How long a claim holds a job without renewal (renewed every quarter).
    pub lease: Duration,
    /// Lapsed leases in a row after which a job goes DEAD.
    pub max_lease_losses: i32,
    /// How long a job handed back for lacking targets may wait for a worker
    /// that has them before it fails.
    pub missing_target_wait: Duration,
    /// Retry backoff base: `base × 2^(attempt−1)`, capped at
    /// `backoff_max`, jittered within its upper half.
    pub backoff_base: Duration,
    /// The longest pause between a job's attempts.
    pub backoff_max: Duration,
    /// Claim loops per process.
    pub claim_loops: usize,
    /// How often the sweeper looks for expired leases.
    pub sweep_interval: Duration,
    /// Most rows one sweep pass touches.
    pub sweep_batch: i64,
    /// Longest an idle claim loop waits before polling again.
    pub idle_poll_max: Duration,
    /// First wait of an idle claim loop, doubling up to `idle_poll_max`.
    pub idle_poll_min: Duration,
    /// Whether the claim loops listen for other processes' wake-ups
    /// (`flotilla_store::wake`); off, work from elsewhere is found by polls.
    pub listen_for_work: bool,
    /// Whether a job submitted while a claim loop of this process waits is
    /// written already claimed and run at once (`run/claiming/eager.rs`).
    pub eager_start: bool,
    /// The largest event the relay can publish: a result whose COMPLETED
    /// event would be larger fails the job instead.
    pub max_event_bytes: usize,
    /// The most bytes one job's stored answers may take
    /// (`support/stored_bytes.rs`): the checkpoint that would cross it is the job's
    /// verdict.
    pub max_stored_bytes: u64,
    /// The most jobs one family (a job nobody started and every job
    /// started under it) may hold: a `start` step past it is the job's
    /// verdict.
    pub max_family_jobs: i32,
    /// Whether a job of a stored workflow points at its version instead of
    /// carrying a copy of the definition: by default, once no worker of an
    /// earlier release (which reads only the copy) is alive (`services/layout_switches.rs`).
    pub definition_by_reference: Switch,
    /// Whether a run's checkpoints start as rows of their own rather than
    /// elements of its row's array (a run already on rows stays on rows
    /// either way): by default, once no worker of an earlier release (which
    /// reads only the array) is alive.
    pub checkpoint_rows: Switch,
    /// Connections of their own for lease renewals and fenced writes, so
    /// that neither waits behind the API, the console or a claim.
    pub reserved_connections: u32,
    /// What one CEL evaluation may spend (steps, bytes, time).
    pub expression_budget: flotilla_workflow::Budget,
    /// How long finished runs are kept (`services/retention.rs`).
    pub retention: RetentionSettings,
}

impl EngineSettings {
    #[must_use]
    pub fn new(worker_id: impl Into<String>) -> Self {
        Self {
            worker_id: worker_id.into(),
            lease: DEFAULT_LEASE,
            max_lease_losses: DEFAULT_MAX_LEASE_LOSSES,
            missing_target_wait: DEFAULT_MISSING_TARGET_WAIT,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_max: DEFAULT_BACKOFF_MAX,
            claim_loops: DEFAULT_CLAIM_LOOPS,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            sweep_batch: DEFAULT_SWEEP_BATCH,
            idle_poll_max: DEFAULT_IDLE_POLL_MAX,
            idle_poll_min: DEFAULT_IDLE_POLL_MIN,
            listen_for_work: true,
            eager_start: true,
            max_event_bytes: flotilla_contracts::topics::DEFAULT_MAX_MESSAGE_BYTES,
            max_stored_bytes: DEFAULT_MAX_STORED_BYTES,
            max_family_jobs: DEFAULT_MAX_FAMILY_JOBS,
            definition_by_reference: Switch::Auto,
            checkpoint_rows: Switch::Auto,
            reserved_connections: DEFAULT_RESERVED_CONNECTIONS,
            expression_budget: flotilla_workflow::DEFAULT_BUDGET,
            retention: RetentionSettings::default(),
        }
    }
}
