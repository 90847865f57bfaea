//! The durable run engine: submission, claims, segments, leases, parking,
//! operator verbs. [`Engine`] is a cheap handle (clone it into every task);
//! the consumer, the API and the tests all drive jobs through it.

mod batch;
pub mod children;
mod claimed;
mod claims;
mod compensate;
mod compiled_cache;
mod complete_step;
mod definitions;
mod digest;
mod evaluate;
mod finishes;
mod fleet;
mod gather;
mod graft;
pub mod graph_view;
mod group_commit;
mod in_flight;
mod items;
pub mod kafka_steps;
mod nodes;
mod operator;
mod placement;
mod reads;
pub mod retention;
mod runner;
mod sanitize;
mod schedule;
pub mod schedules;
pub use sanitize::MAX_ERROR_CHARS;
mod segment;
mod settle;
pub mod signals;
mod step;
mod storable;
pub mod stored_bytes;
mod submit;
mod switches;
mod telemetry;
mod timers;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_runtime::supervise::Health;
use flotilla_store::runs::CheckpointLayout;
use flotilla_store::wake::{Channel, Doorbell};
use sqlx::PgPool;
use tokio::sync::Notify;

pub use batch::BatchOutcome;
pub use claimed::{ClaimedRun, LeaseLost, MAX_HAND_BACKS, SegmentStop};
pub use claims::ClaimError;
pub use complete_step::{CompleteError, CompleteOutcome};
pub use definitions::RegisterError;
pub use fleet::{FINISHED_WINDOW, FleetSnapshot, MEMBER_TTL, Namesake};
pub use flotilla_store::features::Feature;
pub use flotilla_store::{Clock, ManualClock, SystemClock};
pub use graft::{GraftError, GraftOutcome};
#[cfg(feature = "test-support")]
pub use group_commit::CommitFaults;
pub use operator::{Cancelled, OperatorError};
pub use reads::{JobPage, JobQuery, ListError};
pub use segment::Outcome;
pub use storable::{MAX_WORKFLOW_NAME_CHARS, Unstorable};
pub use submit::{RefusalMode, Submission, SubmitError, Submitted, WorkflowRef};
pub use switches::{Switch, SwitchError, SwitchRefused};

use crate::target::Targets;
use crate::workflow::{CompiledWorkflow, InvalidDefinition};

/// Lease a claim holds without renewal, unless configured: short, so a
/// killed worker's jobs resume within about 30 s (lease plus a sweep).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(20);
/// How long a job may wait for a worker that has its targets, unless configured.
pub const DEFAULT_MISSING_TARGET_WAIT: Duration = Duration::from_secs(15 * 60);
/// How many lapsed leases in a row send a job DEAD, unless configured.
pub const DEFAULT_MAX_LEASE_LOSSES: i32 = 3;
/// Base of the retry backoff, unless configured.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Claim loops per process, unless configured. Their checkpoints share
/// commits (`group_commit`), so more loops add jobs in flight, not commits:
/// 16 ran 1.7× the jobs/s of 4 on a 2-core machine.
pub const DEFAULT_WORKER_COUNT: usize = 16;
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
    /// Retry backoff base: `base × 2^(attempt−1)`.
    pub backoff_base: Duration,
    /// Claim loops per process.
    pub worker_count: usize,
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
    /// The largest event the relay can publish: a result whose COMPLETED
    /// event would be larger fails the job instead.
    pub max_event_bytes: usize,
    /// The most bytes one job's stored answers may take
    /// ([`stored_bytes`]): the checkpoint that would cross it is the job's
    /// verdict.
    pub max_stored_bytes: u64,
    /// The most jobs one family (a job nobody started and every job
    /// started under it) may hold: a `start` step past it is the job's
    /// verdict.
    pub max_family_jobs: i32,
    /// Whether a job of a stored workflow points at its version instead of
    /// carrying a copy of the definition: by default, once no worker of an
    /// earlier release (which reads only the copy) is alive (`switches.rs`).
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
    pub expression_budget: crate::workflow::Budget,
    /// How long finished runs are kept (`retention.rs`).
    pub retention: retention::RetentionSettings,
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
            worker_count: DEFAULT_WORKER_COUNT,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            sweep_batch: DEFAULT_SWEEP_BATCH,
            idle_poll_max: DEFAULT_IDLE_POLL_MAX,
            idle_poll_min: DEFAULT_IDLE_POLL_MIN,
            listen_for_work: true,
            max_event_bytes: flotilla_contracts::topics::DEFAULT_MAX_MESSAGE_BYTES,
            max_stored_bytes: stored_bytes::DEFAULT_MAX_STORED_BYTES,
            max_family_jobs: children::DEFAULT_MAX_FAMILY_JOBS,
            definition_by_reference: Switch::Auto,
            checkpoint_rows: Switch::Auto,
            reserved_connections: DEFAULT_RESERVED_CONNECTIONS,
            expression_budget: crate::workflow::DEFAULT_BUDGET,
            retention: retention::RetentionSettings::default(),
        }
    }
}

/// The engine: a database pool, the targets, a clock and the settings.
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    /// Connections for lease renewals and fenced writes only, with lock and
    /// statement timeouts below a quarter of the lease (see [`reserved_pool`]).
    reserved: PgPool,
    targets: Targets,
    clock: Arc<dyn Clock>,
    settings: EngineSettings,
    /// Wakes an idle claim loop when this process makes work claimable.
    work_available: Notify,
    /// Tells other processes' claim loops and the relays what this one committed.
    doorbell: Doorbell,
    /// Compiled definition snapshots, by the digest of the snapshot's text.
    compiled: Mutex<compiled_cache::CompiledCache>,
    /// The supervised tasks of this process (claim loops, sweeper, consumer).
    health: Health,
    /// The fenced writes of many running jobs, committed together.
    group_commit: group_commit::GroupCommit,
    /// Claims of the loops that look for work at once, in one statement.
    claims: claims::Claims,
    /// The jobs this process is running, for the hand-back at shutdown.
    in_flight: in_flight::InFlight,
    /// Jobs this process finished, by minute, for the fleet's tally.
    finishes: finishes::Finishes,
    /// Which one-way switches this worker uses now.
    switches: switches::InUse,
    /// The bounded pool CEL and JSON Schema run on.
    evaluations: evaluate::Evaluations,
    /// When the burst of due schedules this engine is working through
    /// began: set while its passes come back full (see `schedules.rs`).
    schedule_burst: std::sync::Mutex<Option<chrono::DateTime<chrono::Utc>>>,
    /// Finished runs the store refused to remove: passed over by this
    /// engine's retention from then on (see `retention.rs`).
    retention_refused: std::sync::Mutex<Vec<uuid::Uuid>>,
    /// When this engine was made (on its clock): announced to the fleet, so
    /// a worker started again under the same id is told from the one before.
    started_at: chrono::DateTime<chrono::Utc>,
}

/// The reserved connections of an engine: the shared pool's database,
/// `reserved_connections` of them, each with `lock_timeout` a tenth and
/// `statement_timeout` a fifth of the lease, so a row another session
/// holds, or a stuck statement, fails its own write long before any
/// lease it fences could lapse. A connection is waited for at most a
/// quarter of the lease. Opened lazily. Behind a transaction-mode pooler
/// the timeouts cannot stay on a connection (the next transaction may be
/// another client's, on another server connection): each transaction on
/// a reserved connection sets them for itself ([`reserved_timeouts`]).
pub(super) fn reserved_pool(pool: &PgPool, settings: &EngineSettings) -> PgPool {
    let options = sqlx::postgres::PgPoolOptions::new()
        .max_connections(settings.reserved_connections.max(1))
        .acquire_timeout((settings.lease / 4).max(Duration::from_millis(100)));
    let options = if flotilla_store::sql::behind_transaction_pooler() {
        options
    } else {
        let set = reserved_timeouts(settings, false);
        options.after_connect(move |conn, _| {
            let set = set.clone();
            Box::pin(async move {
                flotilla_store::sql::query(&set).execute(conn).await?;
                Ok(())
            })
        })
    };
    options.connect_lazy_with((*pool.connect_options()).clone())
}

/// The statement that sets the reserved connections' timeouts: for the
/// session, or (`local`) for the transaction it runs in.
pub(super) fn reserved_timeouts(settings: &EngineSettings, local: bool) -> String {
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
    let lock_timeout = millis(settings.lease / 10);
    let statement_timeout = millis(settings.lease / 5);
    format!(
        "SELECT set_config('lock_timeout', '{lock_timeout}', {local}), \
                set_config('statement_timeout', '{statement_timeout}', {local})"
    )
}

/// The longest a reply or a signal waits for its job's row lock.
const MAX_ROW_LOCK_WAIT: Duration = Duration::from_secs(5);

impl Engine {
    /// How long a reply or a signal waits for its job's row lock: a tenth
    /// of the lease (as a fenced write does), at most
    /// 5 s, well within the consumer's
    /// `max.poll.interval.ms`, so a row another session holds (an
    /// operator's open `SELECT … FOR UPDATE`) fails the write, which the
    /// consumer rides out as an outage, rather than stall its batch until
    /// the group takes the partition away.
    #[must_use]
    pub fn row_lock_wait(&self) -> Duration {
        (self.settings().lease / 10).clamp(Duration::from_millis(1), MAX_ROW_LOCK_WAIT)
    }

    /// A transaction on a reserved connection, its timeouts set for itself
    /// behind a transaction-mode pooler (where they cannot stay on the
    /// connection).
    ///
    /// # Errors
    /// No reserved connection, or the timeouts could not be set.
    pub(super) async fn begin_reserved(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        let mut tx = self.inner.reserved.begin().await?;
        if flotilla_store::sql::behind_transaction_pooler() {
            flotilla_store::sql::query(&reserved_timeouts(self.settings(), true))
                .execute(&mut *tx)
                .await?;
        }
        Ok(tx)
    }

    /// Runs `work` on a reserved connection, as [`flotilla_store::sql::session`]
    /// does on the shared pool; behind a transaction-mode pooler its
    /// transaction sets the reserved connections' timeouts for itself.
    ///
    /// # Errors
    /// No reserved connection, the commit failed, or what `work` returned.
    pub(super) async fn on_reserved<T, E>(
        &self,
        work: impl AsyncFnOnce(&mut sqlx::PgConnection) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<sqlx::Error>,
    {
        let local = flotilla_store::sql::behind_transaction_pooler()
            .then(|| reserved_timeouts(self.settings(), true));
        flotilla_store::sql::session(&self.inner.reserved, async |conn| {
            if let Some(set) = &local {
                flotilla_store::sql::query(set).execute(&mut *conn).await?;
            }
            work(conn).await
        })
        .await
    }
}

impl Engine {
    #[must_use]
    pub fn new(
        pool: PgPool,
        targets: Targets,
        clock: Arc<dyn Clock>,
        settings: EngineSettings,
    ) -> Self {
        let reserved = reserved_pool(&pool, &settings);
        let doorbell = Doorbell::new(pool.clone());
        let evaluations = evaluate::Evaluations::new(settings.expression_budget);
        let started_at = clock.now();
        Self {
            inner: Arc::new(Inner {
                // A batch's time: a third of the lease, well inside what its
                // heartbeat-renewed writers' leases allow.
                group_commit: group_commit::GroupCommit::new(
                    reserved.clone(),
                    settings.lease / 3,
                    doorbell.clone(),
                    flotilla_store::sql::behind_transaction_pooler()
                        .then(|| reserved_timeouts(&settings, true)),
                ),
                doorbell,
                reserved,
                claims: claims::Claims::new(
                    pool.clone(),
                    clock.clone(),
                    settings.worker_id.clone(),
                    settings.lease,
                ),
                pool,
                targets,
                clock,
                settings,
                work_available: Notify::new(),
                compiled: Mutex::new(compiled_cache::CompiledCache::new(
                    compiled_cache::DEFAULT_CACHE_BYTES,
                )),
                health: Health::default(),
                in_flight: in_flight::InFlight::default(),
                finishes: finishes::Finishes::default(),
                switches: switches::InUse::default(),
                evaluations,
                schedule_burst: std::sync::Mutex::new(None),
                retention_refused: std::sync::Mutex::new(Vec::new()),
                started_at,
            }),
        }
    }

    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The group committer's fault hook, for tests of an ambiguous commit.
    #[cfg(feature = "test-support")]
    #[must_use]
    pub fn commit_faults(&self) -> &CommitFaults {
        self.inner.group_commit.faults()
    }

    /// Claim statements this engine's loops have had answered, for tests
    /// that must know an idle loop has looked once and is waiting.
    #[cfg(feature = "test-support")]
    #[must_use]
    pub fn claim_statements(&self) -> u64 {
        self.inner.claims.statements()
    }

    /// Closes both pools: the shared one and the reserved one.
    pub async fn close(&self) {
        self.inner.reserved.close().await;
        self.inner.pool.close().await;
    }

    #[must_use]
    pub fn settings(&self) -> &EngineSettings {
        &self.inner.settings
    }

    /// The supervised tasks of this process; readiness fails on a dead one.
    #[must_use]
    pub fn health(&self) -> &Health {
        &self.inner.health
    }

    #[must_use]
    pub fn targets(&self) -> &Targets {
        &self.inner.targets
    }

    fn compiled_cache(&self) -> std::sync::MutexGuard<'_, compiled_cache::CompiledCache> {
        self.inner
            .compiled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.inner.clock.now()
    }

    /// A job reached the final `state`: counted in the metrics and in this
    /// process's tally of finishes.
    fn job_finished(
        &self,
        (workflow, version): (&str, Option<i32>),
        state: &'static str,
        created_at: chrono::DateTime<chrono::Utc>,
    ) {
        telemetry::job_finished(&telemetry::label(workflow, version), state, created_at);
        self.inner.finishes.record(state, self.now());
    }

    /// Where runs this engine starts checkpointing keep their checkpoints.
    #[must_use]
    pub fn checkpoint_layout(&self) -> CheckpointLayout {
        if self.uses(Feature::CheckpointRows) {
            CheckpointLayout::Rows
        } else {
            CheckpointLayout::Array
        }
    }

    /// Tells an idle claim loop of this process, and those of other
    /// processes, that a job became claimable; and the relays that its
    /// events wait (every path that makes a job claimable wrote one).
    fn wake(&self) {
        self.inner.work_available.notify_one();
        self.inner.doorbell.ring(Channel::Runs);
        self.inner.doorbell.ring(Channel::Outbox);
    }

    /// Compiles a definition document against this worker's targets,
    /// reusing an earlier compilation. A compilation runs on the
    /// evaluation threads (`evaluate.rs`): it can take a while (a schema's
    /// patterns), and the CEL parser needs their deep stacks.
    ///
    /// # Errors
    /// Every problem of the definition.
    pub async fn compile(
        &self,
        document: &serde_json::Value,
    ) -> Result<Arc<CompiledWorkflow>, InvalidDefinition> {
        self.compile_cached(document, false).await
    }

    /// Compiles a stored definition for a submission: it was checked against
    /// its registrar's targets, and this worker may lack some of them during
    /// a rolling deploy (placement decides at run time, see `placement.rs`).
    pub(super) async fn compile_stored(
        &self,
        document: &serde_json::Value,
    ) -> Result<Arc<CompiledWorkflow>, InvalidDefinition> {
        self.compile_held(document, true).await
    }

    /// Compiles the definition a job runs (its row's): as [`Engine::compile`],
    /// but one accepted before this release's bounds on `max_attempts`
    /// and `deadline_ms` is held to them rather than refused
    /// (`limits::held_to_bounds`).
    ///
    /// # Errors
    /// Every problem of the definition.
    pub(super) async fn compile_to_run(
        &self,
        document: &serde_json::Value,
    ) -> Result<Arc<CompiledWorkflow>, InvalidDefinition> {
        self.compile_held(document, false).await
    }

    /// [`Engine::compile_cached`] of `document` held to this release's
    /// bounds (`limits::held_to_bounds`).
    async fn compile_held(
        &self,
        document: &serde_json::Value,
        any_target: bool,
    ) -> Result<Arc<CompiledWorkflow>, InvalidDefinition> {
        match crate::workflow::limits::held_to_bounds(document) {
            Some(held) => {
                tracing::debug!(workflow = %held["name"], "a definition stored before the bounds on max_attempts and deadline_ms runs held to them");
                self.compile_cached(&held, any_target).await
            }
            None => self.compile_cached(document, any_target).await,
        }
    }

    async fn compile_cached(
        &self,
        document: &serde_json::Value,
        any_target: bool,
    ) -> Result<Arc<CompiledWorkflow>, InvalidDefinition> {
        let text = format!("{}{document}", if any_target { "*" } else { "" });
        let key = compiled_cache::CompiledCache::key(&text);
        if let Some(compiled) = self.compiled_cache().get(&key) {
            return Ok(compiled);
        }
        let mut known = self.inner.targets.names();
        if any_target {
            known.extend(
                document["steps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|step| step["target"].as_str().map(str::to_owned)),
            );
        }
        let owned = document.clone();
        let compiled = self
            .on_pool(move || CompiledWorkflow::compile(&owned, &known))
            .await?;
        let compiled = Arc::new(compiled);
        let weight = compiled.weight(text.len());
        self.compiled_cache().insert(key, compiled.clone(), weight);
        Ok(compiled)
    }
}
