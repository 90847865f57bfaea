//! Wake-ups across processes. A process that has committed work for
//! others rings a channel (`NOTIFY`); loops of other processes that listen
//! on it look at once instead of at their next idle poll. Two channels: new
//! claimable runs (the workers' claim loops listen) and new outbox rows (the
//! relays listen).
//!
//! The ring is a statement of its own after the commit, never part of the
//! committing transaction: a transaction that notifies takes a lock of the
//! whole database at its commit, which would put every commit of the fleet
//! in one line. Rings that come while one is on its way, or within
//! [`RING_INTERVAL`] of it, fold into the next: a busy process, whose loops
//! need no waking, sends at most one `NOTIFY` per interval and channel
//! instead of one per round trip (thousands a second on a local server,
//! which cost the database and the process as much as the work did).
//!
//! A wake-up is a hint, never the only way work is found: a lost one (a
//! listener reconnecting, a pooler in transaction mode, which does not pass
//! notifications on) costs the idle poll's interval and nothing else. So a
//! failure to ring or to listen is about the world: logged once per
//! outage, never an error of the work.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// What a ring says is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// Runs that can be claimed now (a submission, a retry, an answer).
    Runs,
    /// Outbox rows to publish.
    Outbox,
}

impl Channel {
    /// The Postgres channel name.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Runs => "flotilla_runs",
            Self::Outbox => "flotilla_outbox",
        }
    }
}

/// Rings the channels on `pool`, one task per channel, started by the
/// first ring (so making one needs no runtime). Clones share the tasks,
/// which end when the last clone is dropped or the pool closes.
#[derive(Debug, Clone)]
pub struct Doorbell {
    inner: Arc<Bells>,
}

#[derive(Debug)]
struct Bells {
    pool: PgPool,
    runs: Arc<Notify>,
    outbox: Arc<Notify>,
    started: OnceLock<()>,
    stop: CancellationToken,
}

impl Drop for Bells {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Doorbell {
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self {
            inner: Arc::new(Bells {
                pool,
                runs: Arc::new(Notify::new()),
                outbox: Arc::new(Notify::new()),
                started: OnceLock::new(),
                stop: CancellationToken::new(),
            }),
        }
    }

    /// Rings `channel` once what the caller committed is visible. Returns
    /// at once; outside a Tokio runtime it does nothing.
    pub fn ring(&self, channel: Channel) {
        let bells = &self.inner;
        bells.started.get_or_init(|| {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            for (channel, rung) in [
                (Channel::Runs, &bells.runs),
                (Channel::Outbox, &bells.outbox),
            ] {
                let (pool, rung, stop) = (bells.pool.clone(), rung.clone(), bells.stop.clone());
                runtime.spawn(ringer(pool, channel, rung, stop));
            }
        });
        match channel {
            Channel::Runs => bells.runs.notify_one(),
            Channel::Outbox => bells.outbox.notify_one(),
        }
    }
}

/// Shortest time between two `NOTIFY`s of one channel from one process:
/// what a wake-up may wait at most behind the one before it.
pub const RING_INTERVAL: Duration = Duration::from_millis(10);

/// Sends one `NOTIFY` per ring, rings that came meanwhile (or within
/// [`RING_INTERVAL`] after) folded into one.
async fn ringer(pool: PgPool, channel: Channel, rung: Arc<Notify>, stop: CancellationToken) {
    let mut failing = false;
    loop {
        // A ring made before the last doorbell was dropped still goes out.
        tokio::select! {
            biased;
            () = rung.notified() => {}
            () = stop.cancelled() => return,
        }
        if pool.is_closed() {
            return;
        }
        let sent = crate::sql::session(&pool, async |conn| {
            crate::sql::query("SELECT pg_notify($1, '')")
                .bind(channel.name())
                .execute(conn)
                .await
        })
        .await;
        match sent {
            Ok(_) if failing => {
                failing = false;
                tracing::info!(channel = channel.name(), "wake-ups are sent again");
            }
            Ok(_) => {}
            Err(_) if pool.is_closed() => return,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(channel = channel.name(), error = %e,
                    "a wake-up could not be sent; other processes find the work at their next poll");
            }
            Err(_) => {}
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RING_INTERVAL) => {}
        }
    }
}

/// Pause before listening again after the connection failed.
const RELISTEN_PAUSE: Duration = Duration::from_secs(1);

/// Listens on `channel` until `stop`, calling `wake` for every notification
/// and after every (re)connection, since notifications sent while the
/// listener was away are lost. The listener's connection is one of its own,
/// opened with `pool`'s settings, or with `--db-listen-url`'s when given
/// (behind a transaction-mode pooler, which cannot carry a `LISTEN`;
/// without one nothing listens there).
pub async fn listen(pool: PgPool, channel: Channel, wake: impl Fn(), stop: CancellationToken) {
    let pool = match crate::pool::listen_options() {
        Some(options) => PgPool::connect_lazy_with(options.clone()),
        None if crate::sql::behind_transaction_pooler() => {
            tracing::info!(
                channel = channel.name(),
                "behind a transaction-mode pooler with no --db-listen-url: not listening for wake-ups; work from other processes is found at the next poll"
            );
            stop.cancelled().await;
            return;
        }
        None => pool,
    };
    let mut failing = false;
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(channel.name()).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let outcome = tokio::select! {
            () = stop.cancelled() => return,
            connected = connected => connected,
        };
        let error = match outcome {
            Ok(mut listener) => {
                if failing {
                    failing = false;
                    tracing::info!(channel = channel.name(), "listening for wake-ups again");
                }
                wake();
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        received = listener.recv() => match received {
                            Ok(_) => wake(),
                            Err(e) => break e,
                        },
                    }
                }
            }
            Err(e) => e,
        };
        if !failing {
            failing = true;
            tracing::warn!(channel = channel.name(), error = %error,
                "not listening for wake-ups; work from other processes is found at the next poll");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RELISTEN_PAUSE) => {}
        }
    }
}
