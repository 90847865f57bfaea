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
//! loop that looks for work, before it claims; one that waited behind busy
//! loops until less than half its lease is left, or is still waiting when
//! the engine stops, is handed back to the queue. A process that dies between
//! the commit and the run leaves the row RUNNING under its lease: the lease
//! lapses and the sweeper requeues it, as for a claim whose loop died.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};
use flotilla_store::runs::RunRow;
use uuid::Uuid;

/// The seats of one engine's claim loops, and the rows handed to them.
#[derive(Debug, Default)]
pub(crate) struct Seats(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    /// Loops waiting for work now.
    waiting: usize,
    /// Seats reserved by submissions not yet committed.
    promised: usize,
    /// Rows written claimed, not yet taken by a loop.
    handed: VecDeque<RunRow>,
}

impl Seats {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Offers a loop's seat while the guard lives: the loop is waiting.
    pub(crate) fn offer(&self) -> Offered<'_> {
        self.lock().waiting += 1;
        Offered(self)
    }

    /// Reserves up to `wanted` free seats.
    pub(crate) fn reserve(&self, wanted: usize) -> Reservation<'_> {
        let mut state = self.lock();
        let taken = state.promised + state.handed.len();
        let count = state.waiting.saturating_sub(taken).min(wanted);
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

    /// Every row handed over and not yet run, as (job, lease token): what
    /// a stopping engine hands back.
    pub(crate) fn drain(&self) -> Vec<(Uuid, Uuid)> {
        self.lock()
            .handed
            .drain(..)
            .filter_map(|row| Some((row.job_id, row.lease_token?)))
            .collect()
    }

    /// The oldest row handed over and not yet run whose lease lasts past
    /// `fresh_until`, and every older one whose lease does not (as (job,
    /// lease token)): a row that waited behind busy loops for most of its
    /// lease is handed back, not run on a lease that may lapse under it.
    pub(crate) fn take(&self, fresh_until: DateTime<Utc>) -> (Option<RunRow>, Vec<(Uuid, Uuid)>) {
        let mut state = self.lock();
        let mut stale = Vec::new();
        while let Some(row) = state.handed.pop_front() {
            match (row.lease_until, row.lease_token) {
                (Some(until), Some(_)) if until > fresh_until => return (Some(row), stale),
                (_, Some(token)) => stale.push((row.job_id, token)),
                (_, None) => {}
            }
        }
        (None, stale)
    }
}

/// A waiting loop's seat; withdrawn when dropped.
#[derive(Debug)]
pub(crate) struct Offered<'a>(&'a Seats);

impl Drop for Offered<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.waiting = state.waiting.saturating_sub(1);
    }
}

/// Seats a submission holds until it hands its rows over or drops them.
#[derive(Debug)]
pub(crate) struct Reservation<'a> {
    seats: &'a Seats,
    count: usize,
}

impl Reservation<'_> {
    /// How many rows may be written claimed.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Hands the rows written claimed (at most [`Self::count`]) to the
    /// loops, and gives the other seats back; returns how many were handed.
    pub(crate) fn hand(mut self, rows: Vec<RunRow>) -> usize {
        let handed = rows.len().min(self.count);
        let mut state = self.seats.lock();
        state.promised = state.promised.saturating_sub(self.count);
        self.count = 0;
        state.handed.extend(rows.into_iter().take(handed));
        handed
    }
}

impl Drop for Reservation<'_> {
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

    /// A submission gets no more seats than loops wait, less what earlier
    /// submissions hold or handed and no loop has taken yet.
    #[test]
    fn seats_are_never_more_than_the_loops_waiting() {
        let seats = Seats::default();
        assert_eq!(seats.reserve(1).count(), 0, "no loop waits");
        let (_a, _b) = (seats.offer(), seats.offer());
        let first = seats.reserve(5);
        assert_eq!(first.count(), 2);
        assert_eq!(seats.reserve(1).count(), 0, "both promised");
        drop(first);
        assert_eq!(seats.reserve(1).count(), 1, "given back when dropped");
    }

    /// Seats a submission did not use go back when it hands its rows over.
    #[test]
    fn unused_seats_go_back_when_the_rows_are_handed() {
        let seats = Seats::default();
        let _waiting: Vec<_> = (0..3).map(|_| seats.offer()).collect();
        let reservation = seats.reserve(3);
        assert_eq!(reservation.hand(Vec::new()), 0);
        assert_eq!(seats.reserve(3).count(), 3, "all back");
        let (row, stale) = seats.take(Utc::now());
        assert!(row.is_none() && stale.is_empty());
    }

    /// A loop that stops waiting withdraws its seat.
    #[test]
    fn a_loop_that_stops_waiting_withdraws_its_seat() {
        let seats = Seats::default();
        drop(seats.offer());
        assert_eq!(seats.reserve(1).count(), 0);
    }
}
