//! Receiving signals: the one door the API, the CLI, the console and the
//! signal topic all go through (docs/architecture.md, "Signals").
//!
//! A signal is kept in its job's row under the row lock, with an ACCEPTED
//! event, whatever the job is doing; the `wait_for` step that waits for it
//! takes it when the job runs (`nodes/wait.rs`). A job parked on such a wait is
//! requeued at once; a running one is not disturbed (the event is left out
//! of its holder's fence).

use serde::Serialize;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use flotilla_store::runs::signals::{self, MAX_KEPT, MAX_KEPT_BYTES, SignalEntry, Wake};
use flotilla_store::runs::{self, READER_LEVEL, RunRow};
use flotilla_store::{RunStatus, StoreError};

use crate::Engine;
use crate::support::digest::write_canonical;
use crate::support::storable::{self, Unstorable};
use flotilla_workflow::CompiledWorkflow;
use flotilla_workflow::schema_violations;

/// The largest payload a signal carries, serialized.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// The largest `source` a signal carries, serialized.
pub const MAX_SOURCE_BYTES: usize = 16 * 1024;
/// The longest idempotency key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// A signal as sent.
#[derive(Debug, Clone)]
pub struct Signal {
    pub job_id: Uuid,
    pub name: String,
    pub payload: Json,
    pub source: Json,
    /// The same key twice is one signal.
    pub idempotency_key: String,
}

/// What a signal came to.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SignalReceipt {
    pub job_id: Uuid,
    /// Its number in the job, from 1.
    pub seq: i64,
    pub name: String,
    pub idempotency_key: String,
    pub received_at: chrono::DateTime<chrono::Utc>,
    /// Whether this key was received before (this is that receipt).
    pub repeat: bool,
    /// Whether a step took it already.
    pub consumed: bool,
    /// Whether the job waited for it and was queued to take it.
    pub woke_job: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("job {0} not found")]
    NotFound(Uuid),
    #[error("job {job_id} is {status}: it takes no more signals")]
    Finished { job_id: Uuid, status: RunStatus },
    #[error(
        "signal key {key:?} was received by job {job_id} with other content; the first one stays"
    )]
    Conflict { job_id: Uuid, key: String },
    #[error(
        "no step of job {job_id}'s workflow waits for a signal named {name:?}, or each that does has its answer"
    )]
    NotAwaited { job_id: Uuid, name: String },
    #[error("step {step} of job {job_id} stopped waiting for this signal: its timeout_ms passed")]
    TimedOut { job_id: Uuid, step: String },
    #[error("the payload does not fit the output schema of the step waiting for it: {}", violations.join("; "))]
    Misfit {
        job_id: Uuid,
        violations: Vec<String>,
    },
    #[error(
        "job {job_id} holds {MAX_KEPT} signals, or {MAX_KEPT_BYTES} bytes of them, none of its steps has taken; it takes no more until one is"
    )]
    Full { job_id: Uuid },
    /// The signal breaks a limit or holds what the store cannot keep.
    #[error("{0}")]
    Invalid(#[from] Unstorable),
    #[error(
        "job {job_id} needs a worker that reads run layout {needs} (this one reads up to {reads}); signal it through a worker of the newer release"
    )]
    TooNew {
        job_id: Uuid,
        needs: i16,
        reads: i16,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for SignalError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

impl SignalError {
    /// A short stable code for dead letters and metrics; `None` for a
    /// failure of the world (the store), which is retried.
    #[must_use]
    pub fn code(&self) -> Option<&'static str> {
        Some(match self {
            Self::NotFound(_) => "unknown_job",
            Self::Finished { .. } => "job_finished",
            Self::Conflict { .. } => "conflict",
            Self::NotAwaited { .. } => "not_awaited",
            Self::TimedOut { .. } => "wait_timed_out",
            Self::Misfit { .. } => "payload_misfit",
            Self::Full { .. } => "signals_full",
            Self::Invalid(_) => "invalid",
            Self::TooNew { .. } => "too_new",
            Self::Store(e) if e.is_about_the_data() => "unstorable",
            Self::Store(_) => return None,
        })
    }
}

/// Checks the limits and what the store cannot hold.
fn check(signal: &Signal) -> Result<(), Unstorable> {
    let invalid = |field: &str, reason: String| Unstorable {
        field: field.to_owned(),
        reason,
    };
    if signal.name.trim().is_empty() {
        return Err(invalid("name", "is blank".into()));
    }
    let name_limit = flotilla_workflow::limits::MAX_SIGNAL_NAME_BYTES;
    if signal.name.len() > name_limit {
        return Err(invalid(
            "name",
            format!(
                "is {} bytes, over the limit of {name_limit}",
                signal.name.len()
            ),
        ));
    }
    if signal.idempotency_key.trim().is_empty() {
        return Err(invalid("idempotency_key", "is blank".into()));
    }
    if signal.idempotency_key.len() > MAX_KEY_BYTES {
        return Err(invalid(
            "idempotency_key",
            format!(
                "is {} bytes, over the limit of {MAX_KEY_BYTES}",
                signal.idempotency_key.len()
            ),
        ));
    }
    for (field, value, limit) in [
        ("payload", &signal.payload, MAX_PAYLOAD_BYTES),
        ("source", &signal.source, MAX_SOURCE_BYTES),
    ] {
        let size = value.to_string().len();
        if size > limit {
            return Err(invalid(
                field,
                format!("is {size} bytes, over the limit of {limit}"),
            ));
        }
    }
    storable::check_text("name", &signal.name)?;
    storable::check_text("idempotency_key", &signal.idempotency_key)?;
    storable::check_json("payload", &signal.payload)?;
    storable::check_json("source", &signal.source)
}

/// The violations of `payload` against the output schema of a step that
/// waits for `name`; `None` when it fits every one.
fn misfits(compiled: &CompiledWorkflow, name: &str, payload: &Json) -> Option<Vec<String>> {
    compiled
        .steps
        .iter()
        .filter(|step| step.definition.wait_for.as_deref() == Some(name))
        .filter_map(|step| step.output_schema.as_ref())
        .find_map(|schema| schema_violations(schema, payload).err())
}

/// What identifies a signal's content under its key.
fn digest(signal: &Signal) -> String {
    let mut canonical = String::new();
    write_canonical(
        &serde_json::json!({
            "name": signal.name,
            "payload": signal.payload,
            "source": signal.source,
        }),
        &mut canonical,
    );
    Sha256::digest(canonical.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn receipt(job_id: Uuid, entry: &SignalEntry, repeat: bool, woke_job: bool) -> SignalReceipt {
    SignalReceipt {
        job_id,
        seq: entry.seq,
        name: entry.name.clone(),
        idempotency_key: entry.idempotency_key.clone(),
        received_at: entry.received_at,
        repeat,
        consumed: !entry.is_pending(),
        woke_job,
    }
}

/// Whether the signal `name` wakes the job: it is parked (on whatever
/// step: a person's answer, another wait, a child), and a `wait_for` step
/// of that name is ready now (every step it needs has ended) and
/// unanswered. Anything else keeps the signal for the job's next run: a
/// QUEUED job takes it when it is claimed, at the time it already had (a
/// retry's backoff, a timer's instant, both kept).
fn wakes(row: &RunRow, name: &str) -> bool {
    if row.status != RunStatus::Waiting {
        return false;
    }
    row.definition.0["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["wait_for"].as_str() == Some(name))
        .filter_map(|s| s["name"].as_str())
        .any(|step| crate::ops::graph_view::is_ready_now(row, step))
}

impl Engine {
    /// Receives `signal` for its job: kept in the row with its event (a
    /// repeat of its key with the same content gives the first receipt).
    ///
    /// # Errors
    /// Unknown or finished job, a conflicting repeat, a name no step waits
    /// for, a job full of untaken signals, an invalid signal (all about
    /// this signal); store errors.
    pub async fn send_signal(&self, signal: Signal) -> Result<SignalReceipt, SignalError> {
        check(&signal)?;
        let digest = digest(&signal);
        let job_id = signal.job_id;
        // The payload is judged before the row is locked: compiling and
        // checking a schema must not hold the lock a running job's
        // checkpoint needs.
        let definition = flotilla_store::sql::session(self.pool(), async |conn| {
            runs::definition_of(conn, job_id).await
        })
        .await?
        .ok_or(SignalError::NotFound(job_id))?;
        self.check_payload(job_id, &definition, &signal).await?;
        let now = self.now();
        let mut tx = self.pool().begin().await?;
        // A row another session holds fails the signal (about the world:
        // retried) rather than stall the consumer's batch.
        flotilla_store::sql::bound_lock_wait(&mut tx, self.row_lock_wait()).await?;
        // Read once, locked, without the answers: a signal judges which
        // steps have ended, never what they said (review M6).
        let row = runs::outline_for_update(&mut tx, job_id)
            .await?
            .ok_or(SignalError::NotFound(job_id))?;
        if row.reader_level > READER_LEVEL {
            return Err(SignalError::TooNew {
                job_id,
                needs: row.reader_level,
                reads: READER_LEVEL,
            });
        }
        let mut kept = signals::entries(&row)?;
        if let Some(earlier) = kept
            .iter()
            .find(|s| s.idempotency_key == signal.idempotency_key)
        {
            tx.rollback().await?;
            return if earlier.digest == digest {
                Ok(receipt(job_id, earlier, true, false))
            } else {
                Err(SignalError::Conflict {
                    job_id,
                    key: signal.idempotency_key,
                })
            };
        }
        // Each refusal ends the transaction first: a dropped one keeps the
        // row locked until its connection is used again.
        if row.status.is_finished() {
            tx.rollback().await?;
            return Err(SignalError::Finished {
                job_id,
                status: row.status,
            });
        }
        // Read from the job's own definition, not compiled against this
        // worker's targets (a worker lacking one must not refuse a signal).
        // A wait that has its answer takes no more: a signal kept for it
        // would only fill the row (review M6).
        // A wait past its `timeout_ms` takes no more either, even before
        // the job wakes to end it: the signal came too late, and says so.
        let waits: Vec<&str> = row.definition.0["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|step| step["wait_for"].as_str() == Some(signal.name.as_str()))
            .filter_map(|step| step["name"].as_str())
            .collect();
        let timed_out = |step: &&str| row.wait_timed_out(step, now);
        let awaited = waits
            .iter()
            .any(|step| !row.has_checkpoint(step) && !timed_out(step));
        if !awaited {
            tx.rollback().await?;
            if let Some(step) = waits.iter().find(|step| timed_out(step)) {
                return Err(SignalError::TimedOut {
                    job_id,
                    step: (*step).to_owned(),
                });
            }
            return Err(SignalError::NotAwaited {
                job_id,
                name: signal.name,
            });
        }
        let entry = SignalEntry {
            // Every signal ever received counts in `foreign_events`.
            seq: i64::from(row.foreign_events) + 1,
            name: signal.name,
            idempotency_key: signal.idempotency_key,
            digest,
            payload: signal.payload,
            source: signal.source,
            received_at: now,
            consumed_by: None,
            consumed_at: None,
        };
        // At most MAX_KEPT signals and MAX_KEPT_BYTES of them: each one
        // rewrites the row's array, so its size is what a signal costs
        // (review M6: the 99th of 60 KiB signals took 187 ms, a small one
        // 3 ms). Taken signals make room, oldest first.
        let size = |s: &SignalEntry| serde_json::to_vec(s).map_or(0, |v| v.len());
        let mut bytes = kept.iter().map(size).sum::<usize>() + size(&entry);
        while kept.len() >= MAX_KEPT || bytes > MAX_KEPT_BYTES {
            match kept.iter().position(|s| !s.is_pending()) {
                Some(oldest) => {
                    bytes -= size(&kept[oldest]);
                    kept.remove(oldest);
                }
                None => {
                    tx.rollback().await?;
                    return Err(SignalError::Full { job_id });
                }
            }
        }
        let wake = if wakes(&row, &entry.name) {
            Wake::Requeue
        } else {
            Wake::Keep
        };
        kept.push(entry.clone());
        if !signals::write(&mut tx, job_id, &kept, &entry, wake, now).await? {
            return Err(corrupt(job_id));
        }
        tx.commit().await?;
        metrics::counter!("flotilla_signals_received_total").increment(1);
        if wake == Wake::Requeue {
            self.wake();
        } else {
            self.inner
                .doorbell
                .ring(flotilla_store::wake::Channel::Outbox);
        }
        Ok(receipt(job_id, &entry, false, wake == Wake::Requeue))
    }

    /// The payload must fit the schema of every step that may take it
    /// (when this worker can compile the definition; otherwise the step
    /// judges it when it takes it), and their `validate` rules then.
    async fn check_payload(
        &self,
        job_id: Uuid,
        definition: &Json,
        signal: &Signal,
    ) -> Result<(), SignalError> {
        let Ok(compiled) = self.compile_to_run(definition).await else {
            return Ok(());
        };
        let refused = {
            let (name, payload) = (signal.name.clone(), signal.payload.clone());
            self.off_runtime(move || misfits(&compiled, &name, &payload))
                .await
                .unwrap_or_else(|exhausted| Some(vec![exhausted.to_string()]))
        };
        match refused {
            Some(violations) => Err(SignalError::Misfit { job_id, violations }),
            None => Ok(()),
        }
    }

    /// The signals `job_id` keeps, newest first.
    ///
    /// # Errors
    /// Unknown job; store errors.
    pub async fn signals(&self, job_id: Uuid) -> Result<Vec<SignalEntry>, SignalError> {
        let row =
            flotilla_store::sql::session(self.pool(), async |conn| runs::get(conn, job_id).await)
                .await?
                .ok_or(SignalError::NotFound(job_id))?;
        let mut kept = signals::entries(&row)?;
        kept.reverse();
        Ok(kept)
    }
}

/// The locked, unfinished row did not update.
fn corrupt(job_id: Uuid) -> SignalError {
    SignalError::Store(StoreError::Corrupt {
        job_id,
        reason: "the locked unfinished row did not take its signal".into(),
    })
}
