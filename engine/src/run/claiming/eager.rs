//! Eager start: a job submitted to this process while one of its claim
//! loops waits for work is written already claimed by this worker (RUNNING
//! under a fresh lease token, its first attempt counted, as a claim leaves
//! it) and handed to that loop after the commit. One transaction before
//! its first step instead of two, and no wake-up hop.
//!
//! Seats: a loop waiting for work offers one. A submission reserves at most
//! as many as are free (loops waiting, less the rows promised or handed to
//! them), so a worker never takes more than its idle loops would claim;
//! seats a submission does not use (a repeat, a refusal, a rollback) go
//! back when its [`Reservation`] drops. A handed row is run by the next
//! loop that looks for work, before it claims. A row is handed back to the
//! queue instead when no loop waits for it any more at the hand-over (the
//! loop woke for other work meanwhile), when it waited behind busy loops
//! until less than half its lease is left, and when the engine stops. A process that dies between
//! the commit and the run leaves the row RUNNING under its lease: the lease
//! lapses and the sweeper requeues it, as for a claim whose loop died.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};
use flotilla_store::RunStatus;
use flotilla_store::runs::{self, RunRow};
use uuid::Uuid;

use crate::{Engine, Submitted};

impl Engine {
    /// Seats to ask for `wanted` submissions: none with eager start off.
    pub(crate) fn eager_seats(&self, wanted: usize) -> usize {
        if self.settings().eager_start {
            wanted
        } else {
            0
        }
    }

    /// The lease a submission written already claimed by this worker gets.
    pub(crate) fn eager_lease(&self, now: DateTime<Utc>) -> Option<runs::EagerLease<'_>> {
        let until = now + chrono::TimeDelta::from_std(self.settings().lease).ok()?;
        Some(runs::EagerLease {
            owner: &self.settings().worker_id,
            until,
        })
    }

    /// After the commit: the rows written claimed by this worker go to the
    /// loops waiting, each with a wake-up, and their ACCEPTED events to the
    /// relays; rows no loop waits for any more go back to the queue; the
    /// seats go back. Called before [`Engine::created`] wakes loops for the
    /// QUEUED rows of the same submission, which would take the seats.
    pub(crate) async fn hand_claimed<'s>(
        &self,
        seats: Reservation<'_>,
        submitted: impl IntoIterator<Item = &'s Submitted>,
    ) {
        if seats.count() == 0 {
            return;
        }
        let rows: Vec<RunRow> = submitted
            .into_iter()
            .filter_map(|submitted| match submitted {
                Submitted::Created(row)
                    if row.status == RunStatus::Running
                        && row.lease_owner.as_deref() == Some(&self.settings().worker_id) =>
                {
                    Some(row.clone())
                }
                _ => None,
            })
            .collect();
        if rows.is_empty() {
            return;
        }
        let (handed, back) = seats.hand(rows);
        for _ in 0..handed {
            self.inner.work_available.notify_one();
        }
        self.inner
            .doorbell
            .ring(flotilla_store::wake::Channel::Outbox);
        self.hand_back(&back, "when no claim loop waited for it any more")
            .await;
    }
}

/// What the seats need of a row written claimed: its key and lease.
pub(crate) trait Claimed {
    fn job_id(&self) -> Uuid;
    fn lease_token(&self) -> Option<Uuid>;
    fn lease_until(&self) -> Option<DateTime<Utc>>;
}

impl Claimed for RunRow {
    fn job_id(&self) -> Uuid {
        self.job_id
    }
    fn lease_token(&self) -> Option<Uuid> {
        self.lease_token
    }
    fn lease_until(&self) -> Option<DateTime<Utc>> {
        self.lease_until
    }
}

/// The seats of one engine's claim loops, and the rows handed to them.
#[derive(Debug)]
pub(crate) struct Seats<R = RunRow>(Mutex<State<R>>);

impl<R> Default for Seats<R> {
    fn default() -> Self {
        Self(Mutex::new(State {
            waiting: 0,
            promised: 0,
            handed: VecDeque::new(),
            closed: false,
        }))
    }
}

#[derive(Debug)]
struct State<R> {
    /// Loops waiting for work now.
    waiting: usize,
    /// Seats reserved by submissions not yet committed.
    promised: usize,
    /// Rows written claimed, not yet taken by a loop.
    handed: VecDeque<R>,
    /// The engine stopped: no seat is reserved, nothing handed.
    closed: bool,
}

/// A row's (job, lease token), for a hand-back.
fn key<R: Claimed>(row: &R) -> Option<(Uuid, Uuid)> {
    Some((row.job_id(), row.lease_token()?))
}

impl<R: Claimed> Seats<R> {
    fn lock(&self) -> MutexGuard<'_, State<R>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Offers a loop's seat while the guard lives: the loop is waiting.
    pub(crate) fn offer(&self) -> Offered<'_, R> {
        self.lock().waiting += 1;
        Offered(self)
    }

    /// Reserves up to `wanted` free seats (none once the engine stopped).
    pub(crate) fn reserve(&self, wanted: usize) -> Reservation<'_, R> {
        let mut state = self.lock();
        let taken = state.promised + state.handed.len();
        let free = if state.closed { 0 } else { state.waiting };
        let count = free.saturating_sub(taken).min(wanted);
        state.promised += count;
        Reservation { seats: self, count }
    }

    /// Seats no submission holds now.
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn free(&self) -> usize {
        let state = self.lock();
        state
            .waiting
            .saturating_sub(state.promised + state.handed.len())
    }

    /// Closes the seats for good and returns every row handed over and not
    /// yet run, as (job, lease token): what a stopping engine hands back.
    pub(crate) fn close(&self) -> Vec<(Uuid, Uuid)> {
        let mut state = self.lock();
        state.closed = true;
        state.handed.drain(..).filter_map(|row| key(&row)).collect()
    }

    /// The oldest row handed over and not yet run whose lease lasts past
    /// `fresh_until`, and every older one whose lease does not (as (job,
    /// lease token)): a row that waited behind busy loops for most of its
    /// lease is handed back, not run on a lease that may lapse under it.
    pub(crate) fn take(&self, fresh_until: DateTime<Utc>) -> (Option<R>, Vec<(Uuid, Uuid)>) {
        let mut state = self.lock();
        let mut stale = Vec::new();
        while let Some(row) = state.handed.pop_front() {
            match (row.lease_until(), key(&row)) {
                (Some(until), Some(_)) if until > fresh_until => return (Some(row), stale),
                (_, Some(key)) => stale.push(key),
                (_, None) => {}
            }
        }
        (None, stale)
    }
}

/// A waiting loop's seat; withdrawn when dropped.
#[derive(Debug)]
pub(crate) struct Offered<'a, R: Claimed = RunRow>(&'a Seats<R>);

impl<R: Claimed> Drop for Offered<'_, R> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.waiting = state.waiting.saturating_sub(1);
    }
}

/// Seats a submission holds until it hands its rows over or drops them.
#[derive(Debug)]
pub(crate) struct Reservation<'a, R: Claimed = RunRow> {
    seats: &'a Seats<R>,
    count: usize,
}

impl<R: Claimed> Reservation<'_, R> {
    /// How many rows may be written claimed.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Hands the rows written claimed to the loops, as many as loops wait
    /// for now (a loop whose seat this held may have woken for other work
    /// meanwhile), and gives the seats back. Returns how many were handed,
    /// and the others (job, lease token), which the caller hands back to
    /// the queue rather than leave them behind busy loops; all of them
    /// once the engine stops.
    pub(crate) fn hand(mut self, rows: Vec<R>) -> (usize, Vec<(Uuid, Uuid)>) {
        let mut state = self.seats.lock();
        state.promised = state.promised.saturating_sub(self.count);
        self.count = 0;
        let room = if state.closed {
            0
        } else {
            state.waiting.saturating_sub(state.handed.len())
        };
        let mut rows = rows.into_iter();
        let before = state.handed.len();
        state.handed.extend(rows.by_ref().take(room));
        let handed = state.handed.len() - before;
        let back = rows.filter_map(|row| key(&row)).collect();
        (handed, back)
    }
}

impl<R: Claimed> Drop for Reservation<'_, R> {
    fn drop(&mut self) {
        if self.count > 0 {
            let mut state = self.seats.lock();
            state.promised = state.promised.saturating_sub(self.count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row written claimed, leased until `until`.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Row {
        job: Uuid,
        token: Uuid,
        until: DateTime<Utc>,
    }

    impl Claimed for Row {
        fn job_id(&self) -> Uuid {
            self.job
        }
        fn lease_token(&self) -> Option<Uuid> {
            Some(self.token)
        }
        fn lease_until(&self) -> Option<DateTime<Utc>> {
            Some(self.until)
        }
    }

    fn row(until: DateTime<Utc>) -> Row {
        Row {
            job: Uuid::new_v4(),
            token: Uuid::new_v4(),
            until,
        }
    }

    fn seats() -> Seats<Row> {
        Seats::default()
    }

    /// A submission gets no more seats than loops wait, less what earlier
    /// submissions hold or handed and no loop has taken yet.
    #[test]
    fn seats_are_never_more_than_the_loops_waiting() {
        let seats = seats();
        assert_eq!(seats.reserve(1).count(), 0, "no loop waits");
        let (_a, _b) = (seats.offer(), seats.offer());
        let first = seats.reserve(5);
        assert_eq!(first.count(), 2);
        assert_eq!(seats.reserve(1).count(), 0, "both promised");
        drop(first);
        assert_eq!(seats.reserve(1).count(), 1, "given back when dropped");
        let handed = seats.reserve(1);
        assert_eq!(handed.hand(vec![row(Utc::now())]).0, 1);
        assert_eq!(seats.reserve(2).count(), 1, "the handed row holds its seat");
    }

    /// Rows are handed to the loops still waiting; one whose loop woke for
    /// other work meanwhile comes back for a hand-back, as all do once
    /// the seats are closed.
    #[test]
    fn rows_no_loop_waits_for_come_back_to_be_handed_back() {
        let seats = seats();
        let one = seats.offer();
        let two = seats.offer();
        let reservation = seats.reserve(2);
        drop(two);
        let (kept, gone) = (row(Utc::now()), row(Utc::now()));
        let (handed, back) = reservation.hand(vec![kept, gone]);
        assert_eq!((handed, back), (1, vec![(gone.job, gone.token)]));
        let reservation = seats.reserve(1);
        assert_eq!(
            reservation.count(),
            0,
            "the waiting loop is owed the handed row"
        );
        drop(reservation);
        assert_eq!(seats.close(), vec![(kept.job, kept.token)]);
        assert_eq!(seats.reserve(1).count(), 0, "closed");
        drop(one);
    }

    /// A loop takes the oldest row whose lease lasts past the bound; older
    /// rows that do not come back for a hand-back.
    #[test]
    fn a_loop_takes_a_fresh_row_and_stale_ones_come_back() {
        let seats = seats();
        let _waiting: Vec<_> = (0..2).map(|_| seats.offer()).collect();
        let now = Utc::now();
        let (stale, fresh) = (row(now), row(now + chrono::TimeDelta::seconds(30)));
        assert_eq!(seats.reserve(2).hand(vec![stale, fresh]).0, 2);
        let (taken, back) = seats.take(now + chrono::TimeDelta::seconds(10));
        assert_eq!(taken, Some(fresh));
        assert_eq!(back, vec![(stale.job, stale.token)]);
        let (taken, back) = seats.take(now);
        assert!(taken.is_none() && back.is_empty());
    }

    /// Seats a submission did not use go back when it hands its rows over.
    #[test]
    fn unused_seats_go_back_when_the_rows_are_handed() {
        let seats = seats();
        let _waiting: Vec<_> = (0..3).map(|_| seats.offer()).collect();
        let reservation = seats.reserve(3);
        assert_eq!(reservation.hand(Vec::new()), (0, Vec::new()));
        assert_eq!(seats.reserve(3).count(), 3, "all back");
    }

    /// A loop that stops waiting withdraws its seat.
    #[test]
    fn a_loop_that_stops_waiting_withdraws_its_seat() {
        let seats = seats();
        drop(seats.offer());
        assert_eq!(seats.reserve(1).count(), 0);
    }
}
