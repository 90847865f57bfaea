//! The summary at the end: final states against what each kind asked for,
//! target calls per step for the kinds that check them (the retried payment:
//! `authorize` once, `capture` twice), submit → COMPLETED latency, events
//! read back by type, throughput.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::samples::{self, Kind};
use super::{Events, Tracked};

/// One kind's line of the summary.
#[derive(Debug, Default)]
struct Row {
    jobs: usize,
    /// Jobs that ended in the state the kind asked for.
    ended_as_asked: usize,
    /// Final states seen, with their counts.
    states: BTreeMap<String, usize>,
    /// For kinds that check target calls: the calls per step seen (`None`:
    /// none reported), with how many jobs showed them.
    calls: BTreeMap<Option<Vec<u64>>, usize>,
}

impl Row {
    fn states_as_asked(&self) -> bool {
        self.jobs == self.ended_as_asked
    }

    fn calls_as_asked(&self, kind: Kind) -> bool {
        kind.expected_calls().is_none_or(|steps| {
            let asked: Vec<u64> = steps.iter().map(|(_, n)| *n).collect();
            self.calls.keys().all(|seen| seen.as_ref() == Some(&asked))
        })
    }
}

#[derive(Debug)]
pub struct Report {
    rows: BTreeMap<Kind, Row>,
    by_state: BTreeMap<String, usize>,
    latencies_ms: Vec<i64>,
    /// The straight-through sample's path, stage by stage.
    straight: Stages,
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
        let mut rows: BTreeMap<Kind, Row> = BTreeMap::new();
        let mut by_state = BTreeMap::new();
        let mut latencies_ms = Vec::new();
        let mut straight = Stages::default();
        for (id, job) in jobs {
            let row = rows.entry(job.kind).or_default();
            row.jobs += 1;
            if job.status == job.kind.expected() {
                row.ended_as_asked += 1;
            }
            *row.states.entry(job.status.clone()).or_default() += 1;
            if let Some(steps) = job.kind.expected_calls() {
                let seen = samples::reported_calls(&job.checkpoints, steps);
                *row.calls.entry(seen).or_default() += 1;
            }
            *by_state.entry(job.status.clone()).or_default() += 1;
            if let Some(done) = events.completed_at.get(id) {
                latencies_ms.push((*done - job.produced_at).num_milliseconds());
            }
            if job.kind == Kind::Shipping {
                straight.add(job.produced_at, *id, events);
            }
        }
        latencies_ms.sort_unstable();
        straight.sort();
        #[allow(clippy::cast_precision_loss)]
        let seconds = (finished - started).num_milliseconds().max(1) as f64 / 1000.0;
        Self {
            rows,
            by_state,
            latencies_ms,
            straight,
            events: events.by_type.clone(),
            jobs: jobs.len(),
            seconds,
        }
    }

    /// Whether every job ended in the state its kind asked for, having made
    /// the target calls it asked for (where the kind checks them).
    #[must_use]
    pub fn all_as_expected(&self) -> bool {
        self.rows
            .iter()
            .all(|(kind, row)| row.states_as_asked() && row.calls_as_asked(*kind))
    }

    fn percentile(&self, p: usize) -> Option<i64> {
        percentile(&self.latencies_ms, p)
    }

    pub fn print(&self) {
        println!();
        println!(
            "  {:<52} {:>6} {:<10} {:>8}  result",
            "sample", "jobs", "expected", "as asked"
        );
        for (kind, row) in &self.rows {
            let mut verdict = if row.states_as_asked() {
                "ok".to_owned()
            } else {
                let seen: Vec<String> =
                    row.states.iter().map(|(s, c)| format!("{s} {c}")).collect();
                format!("OFF: {}", seen.join(", "))
            };
            if let Some(steps) = kind.expected_calls() {
                verdict.push_str("; ");
                verdict.push_str(&calls_verdict(row, *kind, steps));
            }
            println!(
                "  {:<52} {:>6} {:<10} {:>8}  {verdict}",
                format!("{} ({})", kind.describe(), kind.workflow()),
                row.jobs,
                kind.expected(),
                row.ended_as_asked
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
        self.straight.print(&format!(
            "the straight-through sample of the burst ({} jobs, queued behind the others)",
            self.straight.whole.len()
        ));
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

/// "target calls per job: authorize 1, capture 2", or what was seen instead
/// and in how many jobs.
fn calls_verdict(row: &Row, kind: Kind, steps: &[(&str, u64)]) -> String {
    let written = |counts: &[u64]| -> String {
        let each: Vec<String> = steps
            .iter()
            .zip(counts)
            .map(|((step, _), n)| format!("{step} {n}"))
            .collect();
        each.join(", ")
    };
    if row.calls_as_asked(kind) {
        let asked: Vec<u64> = steps.iter().map(|(_, n)| *n).collect();
        return format!("target calls per job: {}", written(&asked));
    }
    let seen: Vec<String> = row
        .calls
        .iter()
        .map(|(counts, jobs)| match counts {
            Some(counts) => format!("{} in {jobs}", written(counts)),
            None => format!("none reported in {jobs}"),
        })
        .collect();
    format!("target calls OFF: {}", seen.join("; "))
}

/// The `p`th percentile of sorted milliseconds.
fn percentile(sorted_ms: &[i64], p: usize) -> Option<i64> {
    let n = sorted_ms.len();
    (n > 0).then(|| sorted_ms[((n * p).div_ceil(100)).saturating_sub(1).min(n - 1)])
}

/// Where a job's time went, from the times the events carry (stamped by the
/// database at each commit) and this reader's clock: produce → row committed
/// (the broker's delivery to a worker and ingestion), row → COMPLETED
/// committed (the claim and every step), COMPLETED committed → read (the
/// relay and the broker's delivery to this reader).
#[derive(Debug, Default)]
pub struct Stages {
    /// Submit → COMPLETED read, as the person who submitted sees it.
    read: Vec<i64>,
    whole: Vec<i64>,
    to_row: Vec<i64>,
    row_to_completed: Vec<i64>,
    completed_to_read: Vec<i64>,
}

impl Stages {
    pub(super) fn add(&mut self, produced_at: DateTime<Utc>, id: Uuid, events: &Events) {
        let accepted = events.accepted_at.get(&id);
        let completed = events.completed_at.get(&id);
        let read = events.completed_read_at.get(&id);
        if let Some(completed) = completed {
            self.whole
                .push((*completed - produced_at).num_milliseconds());
        }
        if let Some(accepted) = accepted {
            self.to_row
                .push((*accepted - produced_at).num_milliseconds());
        }
        if let (Some(accepted), Some(completed)) = (accepted, completed) {
            self.row_to_completed
                .push((*completed - *accepted).num_milliseconds());
        }
        if let Some(read) = read {
            self.read.push((*read - produced_at).num_milliseconds());
        }
        if let (Some(completed), Some(read)) = (completed, read) {
            self.completed_to_read
                .push((*read - *completed).num_milliseconds());
        }
    }

    pub(super) fn sort(&mut self) {
        for stage in [
            &mut self.read,
            &mut self.whole,
            &mut self.to_row,
            &mut self.row_to_completed,
            &mut self.completed_to_read,
        ] {
            stage.sort_unstable();
        }
    }

    /// Prints the stages under `title`.
    pub fn print(&self, title: &str) {
        let line =
            |name: &str, sorted: &[i64]| match (percentile(sorted, 50), percentile(sorted, 99)) {
                (Some(p50), Some(p99)) => {
                    println!("    {name:<34} p50 {p50:>6} ms, p99 {p99:>6} ms")
                }
                _ => println!("    {name:<34} no job measured"),
            };
        println!("  {title}, by stage:");
        line("submit -> COMPLETED read", &self.read);
        line("submit -> COMPLETED committed", &self.whole);
        line("submit -> row committed", &self.to_row);
        line("row -> COMPLETED committed", &self.row_to_completed);
        line("COMPLETED committed -> read", &self.completed_to_read);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn payment(calls: serde_json::Value) -> Tracked {
        Tracked {
            kind: Kind::Retried,
            produced_at: Utc::now(),
            status: "COMPLETED".into(),
            answered: false,
            checkpoints: json!([
                {"name": "authorize", "skipped": false, "response": {}},
                {"name": "capture", "skipped": false, "response": {"calls": calls}}
            ]),
            signal: None,
        }
    }

    #[test]
    fn a_retried_payment_that_called_authorize_twice_is_off() {
        let resumed = payment(json!({"authorize": 1, "capture": 2}));
        let restarted = payment(json!({"authorize": 2, "capture": 2}));
        let jobs = HashMap::from([(Uuid::new_v4(), resumed.clone())]);
        let now = Utc::now();
        assert!(Report::new(&jobs, &Events::default(), now, now).all_as_expected());
        let jobs = HashMap::from([(Uuid::new_v4(), resumed), (Uuid::new_v4(), restarted)]);
        let report = Report::new(&jobs, &Events::default(), now, now);
        assert!(!report.all_as_expected());
        let row = &report.rows[&Kind::Retried];
        assert_eq!(
            calls_verdict(row, Kind::Retried, Kind::Retried.expected_calls().unwrap()),
            "target calls OFF: authorize 1, capture 2 in 1; authorize 2, capture 2 in 1"
        );
    }
}
