//! The two one-way switches of the run layout (checkpoint rows,
//! definitions by reference) and when this worker uses them.
//!
//! A switch is `auto` by default: it comes on, for the whole database
//! (`fleet_feature`), the first time a worker finds no live worker that
//! cannot read its runs (an earlier release), and stays on. Set `true`, a
//! worker refuses to start while such a worker is alive; `false`, it never
//! writes the new layout (it still reads it). Each worker checks at start
//! and on every sweeper tick, after announcing itself; until it has, every
//! switch is off.

use std::sync::atomic::{AtomicBool, Ordering};

use flotilla_store::StoreError;
use flotilla_store::features::{self, Feature};

use crate::Engine;
use crate::MEMBER_TTL;

/// How a one-way switch is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Switch {
    /// On once no worker that cannot read it is alive.
    #[default]
    Auto,
    /// On; refuse to start while a worker that cannot read it is alive.
    True,
    /// Never written by this worker.
    False,
}

/// A switch set `true` while workers that cannot read its runs are alive.
#[derive(Debug, thiserror::Error)]
#[error(
    "{flag}=true, but worker(s) {} of an earlier release, which cannot read such runs, are alive; \
     stop them first or leave the setting at auto",
    workers.join(", ")
)]
pub struct SwitchRefused {
    pub flag: &'static str,
    pub workers: Vec<String>,
}

/// Errors of settling the switches.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error(transparent)]
    Refused(#[from] SwitchRefused),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for SwitchError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// Which switches this worker uses now.
#[derive(Debug)]
pub(crate) struct InUse {
    checkpoint_rows: AtomicBool,
    definition_by_reference: AtomicBool,
}

impl Default for InUse {
    /// Every switch off until [`Engine::settle_switches`] has looked, even
    /// one set `true`: a worker that starts without its database must not
    /// write a layout an older worker alive may not read.
    fn default() -> Self {
        Self {
            checkpoint_rows: AtomicBool::new(false),
            definition_by_reference: AtomicBool::new(false),
        }
    }
}

impl InUse {
    fn flag(&self, feature: Feature) -> &AtomicBool {
        match feature {
            Feature::CheckpointRows => &self.checkpoint_rows,
            Feature::DefinitionByReference => &self.definition_by_reference,
        }
    }

    pub(crate) fn uses(&self, feature: Feature) -> bool {
        self.flag(feature).load(Ordering::Relaxed)
    }
}

/// The setting's name, for messages.
fn flag(feature: Feature) -> &'static str {
    match feature {
        Feature::CheckpointRows => "FLOTILLA_CHECKPOINT_ROWS",
        Feature::DefinitionByReference => "FLOTILLA_DEFINITION_BY_REFERENCE",
    }
}

impl Engine {
    fn switch(&self, feature: Feature) -> Switch {
        match feature {
            Feature::CheckpointRows => self.settings().checkpoint_rows,
            Feature::DefinitionByReference => self.settings().definition_by_reference,
        }
    }

    /// Whether this worker writes runs with `feature` now.
    #[must_use]
    pub fn uses(&self, feature: Feature) -> bool {
        self.inner.switches.uses(feature)
    }

    /// Decides which switches this worker uses: those on in the database,
    /// and those it may turn on because no worker that cannot read them is
    /// alive (it turns them on for everyone). Call after announcing this
    /// worker (`announce`), so that others deciding see it.
    ///
    /// # Errors
    /// At start (`starting`), a switch set `true` while an older worker is
    /// alive; database errors.
    pub async fn settle_switches(&self, starting: bool) -> Result<(), SwitchError> {
        // Turned on for the database only once that is committed (behind a
        // transaction-mode pooler the session commits at its end).
        let turned_on = flotilla_store::sql::session(self.pool(), async |conn| {
            self.settle_switches_on(conn, starting).await
        })
        .await?;
        for feature in turned_on {
            self.inner
                .switches
                .flag(feature)
                .store(true, Ordering::Relaxed);
            tracing::info!(
                feature = feature.name(),
                "no worker of an earlier release is alive: turned on for the database"
            );
        }
        Ok(())
    }

    /// Settles each switch on `conn`; returns those this call turned on
    /// for the database, for the caller to use once that is committed.
    async fn settle_switches_on(
        &self,
        conn: &mut sqlx::PgConnection,
        starting: bool,
    ) -> Result<Vec<Feature>, SwitchError> {
        let mut turned_on = Vec::new();
        let enabled = features::enabled(conn).await?;
        let worker_id = &self.settings().worker_id;
        let ttl = i64::try_from(MEMBER_TTL.as_millis()).unwrap_or(i64::MAX);
        for feature in Feature::ALL {
            let switch = self.switch(feature);
            let in_use = self.inner.switches.flag(feature);
            if switch == Switch::False {
                in_use.store(false, Ordering::Relaxed);
                continue;
            }
            if enabled.contains(&feature) {
                in_use.store(true, Ordering::Relaxed);
                continue;
            }
            let older =
                features::older_workers(conn, worker_id, feature.reader_level(), ttl).await?;
            if older.is_empty() {
                features::enable(conn, feature, worker_id).await?;
                turned_on.push(feature);
            } else if switch == Switch::True && starting {
                return Err(SwitchRefused {
                    flag: flag(feature),
                    workers: older,
                }
                .into());
            } else if switch == Switch::True {
                tracing::error!(feature = feature.name(), older = ?older, flag = flag(feature),
                    "set true, but workers of an earlier release are alive: off until they stop");
            } else {
                tracing::info!(feature = feature.name(), older = ?older,
                    "waiting for workers of an earlier release to stop before turning it on");
            }
        }
        Ok(turned_on)
    }
}
