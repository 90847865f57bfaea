//! `flotilla-engine`: the durable run engine. [`Engine`] is a cheap handle
//! (clone it into every task); ingest, the API and the tests drive jobs
//! through it. Its methods are spread over folders, one per role:
//!
//! - `run/`: running a claimed job: the claim loops, a segment, the
//!   claimed-run handle and its lease, the group commit, how a segment
//!   settles, compensation;
//! - `nodes/`: the executor of each step kind a workflow author writes
//!   (call, wait, child, Kafka, items, timers, pages);
//! - [`ops`]: what callers ask for (submit, signal, complete, graft, retry,
//!   cancel, register, schedules, queries);
//! - [`services`]: the background chores every worker runs on a timer
//!   (sweeper, scheduler, retention, membership, ...), each started the
//!   same way;
//! - `support/`: helpers every folder uses and that use none of them.
//!
//! Executors and operations never import each other (`scripts/check-layers`
//! holds the imports in CI). Where one needs the other's effect it goes
//! through the one handle: a `start` step submits its child with
//! `Engine::submit_recorded`, a segment that ends a job cancels its
//! children with `Engine::cascade_cancel`. SQL lives in `flotilla-store`, the language in
//! `flotilla-workflow`, what a step calls in `flotilla-targets`.

mod lifecycle;
mod nodes;
pub mod ops;
mod run;
pub mod services;
mod settings;
mod submission;
mod support;

/// The stored shapes the engine answers with (a job's row, its status,
/// its signals and timeline, a stored definition) and its store error:
/// callers name these types; only the engine reaches the store.
pub mod rows {
    pub use flotilla_store::RunStatus;
    pub use flotilla_store::StoreError;
    pub use flotilla_store::definitions::StoredDefinition;
    pub use flotilla_store::outbox::history::TimelineEntry;
    pub use flotilla_store::runs::RunRow;
    pub use flotilla_store::runs::signals::SignalEntry;
}

use std::sync::{Arc, Mutex};

use flotilla_runtime::supervise::Health;
use flotilla_store::runs::CheckpointLayout;
use flotilla_store::wake::{Channel, Doorbell};
use sqlx::PgPool;
use tokio::sync::Notify;

pub use flotilla_contracts::Metadata;
pub use flotilla_contracts::metadata::check as check_metadata;
pub use flotilla_store::features::Feature;
pub use flotilla_store::{Clock, ManualClock, SystemClock};
pub use nodes::child::{DEFAULT_MAX_FAMILY_JOBS, item_key as child_item_key};
pub use ops::batch::BatchOutcome;
pub use ops::complete_step::{CompleteError, CompleteOutcome};
pub use ops::definitions::RegisterError;
pub use ops::fleet::{FINISHED_WINDOW, FleetSnapshot};
pub use ops::graft::{GraftError, GraftOutcome};
pub use ops::operator::{Cancelled, OperatorError};
pub use ops::queries::{JobPage, JobQuery, ListError};
pub use run::claimed::ClaimedRun;
pub use run::claiming::claims::ClaimError;
#[cfg(any(test, feature = "test-support"))]
pub use run::group_commit::CommitFaults;
pub use run::lease::MAX_HAND_BACKS;
pub use run::{LeaseLost, Outcome, SegmentStop};
pub use services::Namesake;
pub use services::layout_switches::{Switch, SwitchError, SwitchRefused};
pub use settings::*;
pub use submission::{
    MAX_PRIORITY, RefusalMode, Submission, SubmitError, Submitted, WorkflowRef, child_id,
};
pub use support::sanitize::MAX_ERROR_CHARS;
pub use support::storable::{MAX_WORKFLOW_NAME_CHARS, Unstorable};
pub use support::stored_bytes::DEFAULT_MAX_STORED_BYTES;

use flotilla_targets::Targets;

/// The engine: a database pool, the targets, a clock and the settings.
#[derive(Debug, Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    /// Connections for lease renewals and fenced writes only, with lock and
    /// statement timeouts below a quarter of the lease (see `run/reserved.rs`).
    pub(crate) reserved: PgPool,
    pub(crate) targets: Targets,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) settings: EngineSettings,
    /// Wakes an idle claim loop when this process makes work claimable.
    pub(crate) work_available: Notify,
    /// Tells other processes' claim loops and the relays what this one committed.
    pub(crate) doorbell: Doorbell,
    /// The API's waits for jobs to finish.
    pub(crate) end_watch: ops::awaiting::EndWatch,
    /// Compiled definition snapshots, by the digest of the snapshot's text.
    pub(crate) compiled: Mutex<support::compiled_cache::CompiledCache>,
    /// The supervised tasks of this process (claim loops, sweeper, consumer).
    pub(crate) health: Health,
    /// The fenced writes of many running jobs, committed together.
    pub(crate) group_commit: run::group_commit::GroupCommit,
    /// Claims of the loops that look for work at once, in one statement.
    pub(crate) claims: run::claiming::claims::Claims,
    /// Idle claim loops' seats, and jobs written claimed for them.
    pub(crate) seats: run::claiming::eager::Seats,
    /// The jobs this process is running, for the hand-back at shutdown.
    pub(crate) in_flight: run::in_flight::InFlight,
    /// Jobs this process finished, by minute, for the fleet's tally.
    pub(crate) finishes: services::finished_tally::Finishes,
    /// Which one-way switches this worker uses now.
    pub(crate) switches: services::layout_switches::InUse,
    /// The bounded pool CEL and JSON Schema run on.
    pub(crate) evaluations: support::eval_pool::Evaluations,
    /// When the burst of due schedules this engine is working through
    /// began: set while its passes come back full (see `services/scheduler.rs`).
    pub(crate) schedule_burst: std::sync::Mutex<Option<chrono::DateTime<chrono::Utc>>>,
    /// Finished runs the store refused to remove: passed over by this
    /// engine's retention from then on (see `services/retention.rs`).
    pub(crate) retention_refused: std::sync::Mutex<Vec<uuid::Uuid>>,
    /// When this engine was made (on its clock): announced to the fleet, so
    /// a worker started again under the same id is told from the one before.
    pub(crate) started_at: chrono::DateTime<chrono::Utc>,
}

impl Engine {
    #[must_use]
    pub fn new(
        pool: PgPool,
        targets: Targets,
        clock: Arc<dyn Clock>,
        settings: EngineSettings,
    ) -> Self {
        let reserved = run::reserved::reserved_pool(&pool, &settings);
        let doorbell = Doorbell::new(pool.clone());
        let evaluations = support::eval_pool::Evaluations::new(settings.expression_budget);
        let started_at = clock.now();
        Self {
            inner: Arc::new(Inner {
                // A batch's time: a third of the lease, well inside what its
                // heartbeat-renewed writers' leases allow.
                group_commit: run::group_commit::GroupCommit::new(
                    reserved.clone(),
                    settings.lease / 3,
                    doorbell.clone(),
                    flotilla_store::sql::behind_transaction_pooler()
                        .then(|| run::reserved::reserved_timeouts(&settings, true)),
                ),
                doorbell,
                end_watch: ops::awaiting::EndWatch::default(),
                reserved,
                claims: run::claiming::claims::Claims::new(
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
                compiled: Mutex::new(support::compiled_cache::CompiledCache::new(
                    support::compiled_cache::DEFAULT_CACHE_BYTES,
                )),
                health: Health::default(),
                seats: run::claiming::eager::Seats::default(),
                in_flight: run::in_flight::InFlight::default(),
                finishes: services::finished_tally::Finishes::default(),
                switches: services::layout_switches::InUse::default(),
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

    /// Seats of this engine's idle claim loops no submission holds now
    /// (`run/claiming/eager.rs`): for tests that must know a loop waits.
    #[cfg(feature = "test-support")]
    #[must_use]
    pub fn free_seats(&self) -> usize {
        self.inner.seats.free()
    }

    /// Offers a seat that no loop will ever fill, for good: a submission
    /// then writes a job claimed by this engine that nothing here runs, as
    /// when the process dies between the commit and the run.
    #[cfg(feature = "test-support")]
    pub fn offer_a_seat_nobody_fills(&self) {
        std::mem::forget(self.inner.seats.offer());
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

    pub(crate) fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.inner.clock.now()
    }

    /// A job reached the final `state`: counted in the metrics and in this
    /// process's tally of finishes.
    pub(crate) fn job_finished(
        &self,
        (workflow, version): (&str, Option<i32>),
        state: &'static str,
        created_at: chrono::DateTime<chrono::Utc>,
    ) {
        support::telemetry::job_finished(
            &support::telemetry::label(workflow, version),
            state,
            created_at,
        );
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
    pub(crate) fn wake(&self) {
        self.inner.work_available.notify_one();
        self.inner.doorbell.ring(Channel::Runs);
        self.inner.doorbell.ring(Channel::Outbox);
    }
}
