//! The summary at the end: final states against what each kind asked for,
//! submit → COMPLETED latency, events read back by type, throughput.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::samples::Kind;
use super::{Events, Tracked};

#[derive(Debug)]
pub struct Report {
    /// Per kind: (jobs, jobs that ended as expected, final states seen).
    rows: BTreeMap<Kind, (usize, usize, BTreeMap<String, usize>)>,
    by_state: BTreeMap<String, usize>,
    latencies_ms: Vec<i64>,
    events: BTreeMap<String, usize>,
    jobs: usize,
    seconds: f64,
}

impl Report {
    #[must_use]
    pub fn new(
        jobs: &HashMap<Uuid, Tracked>,
        events: &Events,
        started: DateTime<Utc>,
        finished: DateTime<Utc>,
    ) -> Self {
        let mut rows: BTreeMap<Kind, (usize, usize, BTreeMap<String, usize>)> = BTreeMap::new();
        let mut by_state = BTreeMap::new();
        let mut latencies_ms = Vec::new();
        for (id, job) in jobs {
            let row = rows.entry(job.kind).or_default();
            row.0 += 1;
            if job.status == job.kind.expected() {
                row.1 += 1;
            }
            *row.2.entry(job.status.clone()).or_default() += 1;
            *by_state.entry(job.status.clone()).or_default() += 1;
            if let Some(done) = events.completed_at.get(id) {
                latencies_ms.push((*done - job.produced_at).num_milliseconds());
            }
        }
        latencies_ms.sort_unstable();
        #[allow(clippy::cast_precision_loss)]
        let seconds = (finished - started).num_milliseconds().max(1) as f64 / 1000.0;
        Self {
            rows,
            by_state,
            latencies_ms,
            events: events.by_type.clone(),
            jobs: jobs.len(),
            seconds,
        }
    }

    /// Whether every job ended in the state its kind asked for.
    #[must_use]
    pub fn all_as_expected(&self) -> bool {
        self.rows.values().all(|(n, ok, _)| n == ok)
    }

    fn percentile(&self, p: usize) -> Option<i64> {
        let n = self.latencies_ms.len();
        (n > 0).then(|| self.latencies_ms[((n * p).div_ceil(100)).saturating_sub(1).min(n - 1)])
    }

    pub fn print(&self) {
        println!();
        println!(
            "  {:<52} {:>6} {:<10} {:>8}  result",
            "sample", "jobs", "expected", "as asked"
        );
        for (kind, (n, ok, seen)) in &self.rows {
            let verdict = if n == ok {
                "ok".to_owned()
            } else {
                let seen: Vec<String> = seen.iter().map(|(s, c)| format!("{s} {c}")).collect();
                format!("OFF: {}", seen.join(", "))
            };
            println!(
                "  {:<52} {n:>6} {:<10} {ok:>8}  {verdict}",
                format!("{} ({})", kind.describe(), kind.workflow()),
                kind.expected()
            );
        }
        let states: Vec<String> = self
            .by_state
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        println!("\n  final states: {}", states.join(", "));
        match (self.percentile(50), self.percentile(99)) {
            (Some(p50), Some(p99)) => println!(
                "  submit -> COMPLETED: p50 {p50} ms, p99 {p99} ms (over {} jobs; approvals included)",
                self.latencies_ms.len()
            ),
            _ => println!("  submit -> COMPLETED: no completed job"),
        }
        let events: Vec<String> = self
            .events
            .iter()
            .map(|(t, n)| format!("{t} {n}"))
            .collect();
        println!("  events read back: {}", events.join(", "));
        #[allow(clippy::cast_precision_loss)]
        let rate = self.jobs as f64 / self.seconds;
        println!(
            "  throughput: {} jobs in {:.1} s = {rate:.1} jobs/s end to end",
            self.jobs, self.seconds
        );
        println!(
            "  {}",
            if self.all_as_expected() {
                "every job ended as its sample asked"
            } else {
                "SOME JOBS DID NOT END AS ASKED"
            }
        );
    }
}
