//! The live view while jobs run: a table of jobs by state, redrawn in place
//! on a terminal; a plain line every few seconds otherwise (CI logs).

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::Tracked;

/// The states shown, in the order a job meets them (PRODUCED: not yet
/// ingested, as far as the API knows).
const STATES: [&str; 8] = [
    "PRODUCED",
    "QUEUED",
    "RUNNING",
    "WAITING",
    "COMPLETED",
    "FAILED",
    "DEAD",
    "CANCELLED",
];

#[derive(Debug)]
pub struct Progress {
    terminal: bool,
    lines_drawn: usize,
    started: Instant,
    last_plain: Option<Instant>,
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress {
    #[must_use]
    pub fn new() -> Self {
        Self {
            terminal: std::io::stdout().is_terminal(),
            lines_drawn: 0,
            started: Instant::now(),
            last_plain: None,
        }
    }

    fn counts(jobs: &HashMap<Uuid, Tracked>) -> BTreeMap<&str, usize> {
        let mut counts = BTreeMap::new();
        for job in jobs.values() {
            *counts.entry(job.status.as_str()).or_default() += 1;
        }
        counts
    }

    /// Shows the current counts.
    pub fn draw(&mut self, jobs: &HashMap<Uuid, Tracked>) {
        let counts = Self::counts(jobs);
        let elapsed = self.started.elapsed().as_secs_f64();
        if self.terminal {
            let mut out = std::io::stdout().lock();
            if self.lines_drawn > 0 {
                // Back to the table's first line, then overwrite it.
                let _ = write!(out, "\x1b[{}A", self.lines_drawn);
            }
            let _ = writeln!(out, "\x1b[2K  jobs by state after {elapsed:5.1} s");
            let mut lines = 1;
            for state in STATES.iter().chain(
                counts
                    .keys()
                    .filter(|s| !STATES.contains(s))
                    .collect::<Vec<_>>(),
            ) {
                let n = counts.get(state).copied().unwrap_or(0);
                let bar = "#".repeat((n * 40).div_ceil(jobs.len().max(1)));
                let _ = writeln!(out, "\x1b[2K  {state:<11} {n:>6}  {bar}");
                lines += 1;
            }
            self.lines_drawn = lines;
            let _ = out.flush();
        } else if self
            .last_plain
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(2))
        {
            self.last_plain = Some(Instant::now());
            let parts: Vec<String> = counts.iter().map(|(s, n)| format!("{s} {n}")).collect();
            println!("demo: {elapsed:5.1} s: {}", parts.join(", "));
        }
    }

    /// The last view, always shown (also when not a terminal).
    pub fn finish(&mut self, jobs: &HashMap<Uuid, Tracked>) {
        self.last_plain = None;
        self.draw(jobs);
    }
}
