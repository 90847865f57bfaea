//! The relay's loop: every bucket it holds streams on its own, with no
//! barrier across buckets.
//!
//! A bucket is *idle* or *busy*. One read plans the next batch of every
//! idle bucket without one (`flotilla_store::outbox::relay::plan`: the
//! names of the rows a fresh snapshot sees and the bucket's progress did
//! not), and fetches a page of each idle bucket's batch; the pages go to
//! the producer at once, in `id` order, so a job's events go in order.
//! Acknowledgements are gathered as they arrive and marked together, one
//! transaction for a few milliseconds' worth; a bucket turns idle again
//! when every row it sent is marked, and its next page goes. The mark
//! after a batch's last page moves the bucket's progress to the batch's
//! snapshot: nothing is written per row published. One mark runs at a
//! time, beside the reads and sends of the buckets it does not touch.
//!
//! The world (broker, registry, database) holding a row back stops its
//! page there and pauses the bucket, doubling up to 10 s; the page goes
//! again, whole. A read that finds nothing pauses the idle buckets,
//! doubling up to the idle poll maximum; bucket leases are rebalanced every
//! third of their term.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use flotilla_runtime::backoff::Doubling;
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod pages;

use pages::{Batch, Page};

use crate::Relay;
use crate::health::Readiness;
use crate::publisher::{Class, Delivery, DrainReport, Marks, Reason};

/// How long acknowledgements gather before they are marked together.
const MARK_GATHER: Duration = Duration::from_millis(2);

/// The pause after the world held rows back, doubling up to this.
const OUTAGE_PAUSE_MAX: Duration = Duration::from_secs(10);

/// Rows sent and not yet marked, at most this many batches' worth.
const BATCHES_IN_FLIGHT: i64 = 4;

/// A mark under way, as a task of its own so it goes on while the loop
/// reads and sends: the buckets whose rows it marks (busy until it ends),
/// those the world held back, and how many rows.
struct Marking {
    task: tokio::task::JoinHandle<Result<DrainReport, sqlx::Error>>,
    ended: Vec<i16>,
    held_back: Vec<i16>,
    count: usize,
    started: Instant,
}

/// The loop's state: which buckets are busy, what is on its way, what
/// waits to be marked.
struct Stream<'a> {
    relay: &'a Relay,
    readiness: &'a Readiness,
    /// The batch each bucket is sending.
    batches: HashMap<i16, Batch>,
    /// The page of each bucket on its way.
    pages: HashMap<i16, Page>,
    /// Rows sent (or ended at once) and not yet marked, per busy bucket.
    outstanding: HashMap<i16, usize>,
    /// Buckets the world held back, and until when they rest.
    resting: HashMap<i16, Instant>,
    deliveries: FuturesUnordered<Delivery>,
    marks: Marks,
    /// The mark under way, if any.
    marking: Option<Marking>,
    /// When the first row now waiting to be marked ended.
    gathering_since: Option<Instant>,
    next_read: Instant,
    next_rebalance: Instant,
    idle: Doubling,
    outage: Doubling,
    /// Where the next read starts in the bucket list, so none starves.
    rotation: usize,
}

impl<'a> Stream<'a> {
    fn new(relay: &'a Relay, readiness: &'a Readiness) -> Self {
        let now = Instant::now();
        Self {
            relay,
            readiness,
            batches: HashMap::new(),
            pages: HashMap::new(),
            outstanding: HashMap::new(),
            resting: HashMap::new(),
            deliveries: FuturesUnordered::new(),
            marks: Marks::default(),
            marking: None,
            gathering_since: None,
            next_read: now,
            next_rebalance: now,
            idle: Doubling::new(relay.settings.idle_poll_min, relay.settings.idle_poll_max),
            outage: Doubling::new(Duration::from_millis(200), OUTAGE_PAUSE_MAX),
            rotation: 0,
        }
    }

    fn in_flight(&self) -> usize {
        self.outstanding.values().sum()
    }

    /// Streams until `shutdown`; then stops reading, waits up to `grace`
    /// for what is on its way, and marks it.
    async fn run(&mut self, shutdown: &CancellationToken, grace: Duration) {
        let mut stop_by: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if stop_by.is_none() {
                if now >= self.next_rebalance {
                    self.rebalance().await;
                }
                if now >= self.next_read {
                    self.read_and_send().await;
                }
            }
            if self.mark_due(now) {
                self.start_mark();
                continue;
            }
            if let Some(deadline) = stop_by
                && (self.deliveries.is_empty() || now >= deadline)
            {
                self.finish_marking().await;
                if !self.marks.is_empty() {
                    self.start_mark();
                    self.finish_marking().await;
                }
                return;
            }
            let wake = [
                Some(self.next_read),
                Some(self.next_rebalance),
                // While a mark is under way the next one waits for it.
                self.gathering_since
                    .filter(|_| self.marking.is_none())
                    .map(|since| since + MARK_GATHER),
                stop_by,
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now);
            let marking = &mut self.marking;
            tokio::select! {
                Some((row, outcome)) = self.deliveries.next(), if !self.deliveries.is_empty() => {
                    self.ended(row, outcome);
                }
                report = async { (&mut marking.as_mut().expect("polled only while marking").task).await },
                    if marking.is_some() =>
                {
                    if let Some(marking) = self.marking.take() {
                        self.finish_mark(marking, report);
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
                // A worker committed events: read now, not at the next poll.
                () = self.relay.events_committed.notified(), if stop_by.is_none() => {
                    self.idle.reset();
                    self.next_read = self.next_read.min(Instant::now());
                }
                () = shutdown.cancelled(), if stop_by.is_none() => {
                    stop_by = Some(Instant::now() + grace);
                }
            }
        }
    }

    /// Mark when the gathering time is up, when a batch's worth waits, or
    /// when nothing else is on its way.
    fn mark_due(&self, now: Instant) -> bool {
        let Some(since) = self.gathering_since else {
            return false;
        };
        if self.marking.is_some() {
            return false;
        }
        now >= since + MARK_GATHER
            || self.marks.len() >= self.batch_size()
            || self.deliveries.is_empty()
    }

    fn batch_size(&self) -> usize {
        usize::try_from(self.relay.settings.batch_size).unwrap_or(usize::MAX)
    }

    async fn rebalance(&mut self) {
        let relay = self.relay;
        self.next_rebalance = Instant::now() + relay.settings.lease / 3;
        // A bucket part way through a batch is kept, so the batch ends here.
        let busy = self
            .outstanding
            .keys()
            .chain(self.batches.keys())
            .copied()
            .collect();
        match relay.leases.rebalance_keeping(&busy).await {
            Ok(held) => {
                metrics::gauge!("flotilla_relay_buckets_held").set(held.len() as f64);
            }
            Err(e) => {
                // Sends stop by themselves when the lease may have run out.
                tracing::warn!(error = %e, "rebalancing bucket leases failed");
                self.readiness.round_failed(true);
            }
        }
    }

    /// Plans the batches of the idle buckets without one, fetches a page of
    /// each idle bucket's batch and hands the pages to the producer.
    async fn read_and_send(&mut self) {
        let relay = self.relay;
        relay.publisher.replace_producer_if_fatal();
        let now = Instant::now();
        self.readiness
            .publishing_stopped(relay.partitions.problem());
        if !relay.partitions.allowed() {
            self.next_read = now + self.outage.next_pause();
            return;
        }
        let batch = relay.settings.batch_size;
        let room = usize::try_from(
            (batch * BATCHES_IN_FLIGHT)
                .saturating_sub(i64::try_from(self.in_flight()).unwrap_or(i64::MAX))
                .min(batch),
        )
        .unwrap_or(0);
        self.resting.retain(|_, until| *until > now);
        let window = relay.settings.send_window();
        let held = relay.leases.held().current_for(window);
        // A batch of a bucket lost is its new owner's to send.
        self.batches.retain(|bucket, _| held.contains(bucket));
        let mut idle: Vec<i16> = held
            .into_iter()
            .filter(|b| !self.outstanding.contains_key(b) && !self.resting.contains_key(b))
            .collect();
        if idle.is_empty() || room == 0 {
            // Woken again by a mark that frees a bucket, or by the next poll.
            self.next_read = now + self.idle.next_pause();
            return;
        }
        self.rotation = (self.rotation + 1) % idle.len();
        idle.rotate_left(self.rotation);
        metrics::counter!("flotilla_relay_rounds_total").increment(1);
        let started = Instant::now();
        let read = self.read_pages(&idle, room).await;
        relay.reads.fetch_add(1, Ordering::Relaxed);
        let (pages, rows) = match read {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(error = %e, "reading the next batches failed");
                self.readiness.round_failed(true);
                self.next_read = Instant::now() + self.outage.next_pause();
                return;
            }
        };
        tracing::debug!(buckets = pages.len(), rows = rows.len(), took = ?started.elapsed(),
            in_flight = self.in_flight(), "read the next pages");
        // Idle buckets whose page did not fit in the room: read again now.
        let waiting = idle.iter().filter(|b| self.batches.contains_key(b)).count();
        let more = pages.len() < waiting;
        self.send_pages(pages, rows, window).await;
        self.next_read = if more {
            Instant::now()
        } else {
            Instant::now() + self.idle.next_pause()
        };
    }

    /// Starts marking what has ended; the loop goes on meanwhile.
    fn start_mark(&mut self) {
        let relay = self.relay;
        let marks = std::mem::take(&mut self.marks);
        self.gathering_since = None;
        let ended: Vec<i16> = marks.buckets().collect();
        let held_back: Vec<i16> = marks.deferred_buckets().collect();
        let count = marks.len();
        let (pool, relay_id) = (relay.pool.clone(), relay.leases.relay_id().to_owned());
        let lease = relay.settings.lease;
        let task = tokio::spawn(async move { marks.mark(&pool, &relay_id, lease).await });
        self.marking = Some(Marking {
            task,
            ended,
            held_back,
            count,
            started: Instant::now(),
        });
    }

    /// Waits for the mark under way, if any, and settles it.
    async fn finish_marking(&mut self) {
        if let Some(mut marking) = self.marking.take() {
            let report = (&mut marking.task).await;
            self.finish_mark(marking, report);
        }
    }

    /// Frees the marked rows' buckets and paces the next read. A mark task
    /// that panicked is a failed mark: its buckets' batches go again whole.
    fn finish_mark(
        &mut self,
        marking: Marking,
        joined: Result<Result<DrainReport, sqlx::Error>, tokio::task::JoinError>,
    ) {
        let Marking {
            ended,
            held_back,
            count,
            started,
            ..
        } = marking;
        let report = joined.unwrap_or_else(|e| {
            tracing::error!(error = %e, "the mark task ended without marking");
            Err(sqlx::Error::Protocol(format!("the mark task ended: {e}")))
        });
        for &bucket in &ended {
            if let Some(count) = self.outstanding.get_mut(&bucket) {
                *count -= 1;
                if *count == 0 {
                    self.outstanding.remove(&bucket);
                }
            }
        }
        let report = match report {
            Ok(report) => report,
            Err(e) => {
                // Nothing is lost: the progress did not move, and the
                // batches start again (their FAILED rows were not written).
                for bucket in &ended {
                    self.batches.remove(bucket);
                }
                tracing::warn!(error = %e, "marking failed; the batches go again");
                self.readiness.round_failed(true);
                let rest = Instant::now() + self.outage.next_pause();
                self.next_read = self.next_read.max(rest);
                return;
            }
        };
        tracing::debug!(count, took = ?started.elapsed(), ?report, "marked");
        record(&report);
        let failing = report.deferred > 0 && report.published == 0;
        self.readiness.round_failed(failing);
        if report.deferred > 0 {
            if failing {
                tracing::warn!(
                    ?report,
                    "nothing could be published; pausing the buckets held back"
                );
                // librdkafka retries a refusal for too few in-sync replicas
                // until the record times out: the topic's state says so.
                let refused = report
                    .misses
                    .keys()
                    .any(|(_, reason)| *reason == Reason::NotEnoughReplicas);
                let short = self.relay.partitions.short_of_replicas();
                self.readiness.failing_because((refused || short.is_some()).then(|| {
                    let seen = short.map_or(String::new(), |(in_sync, required)| {
                        format!(" (a partition has {in_sync} in sync, {required} required)")
                    });
                    format!(
                        "the brokers refuse writes to {}: fewer replicas in sync than its min.insync.replicas (NOT_ENOUGH_REPLICAS){seen}: brokers are down, or the topic is replicated fewer times than it asks",
                        self.relay.settings.event_topic
                    )
                }));
            }
            let rest = Instant::now() + self.outage.next_pause();
            for bucket in held_back {
                self.resting.insert(bucket, rest);
            }
        } else {
            self.outage.reset();
        }
        if count > 0 {
            // The buckets just marked may have their next page waiting.
            self.idle.reset();
            self.next_read = Instant::now();
        }
    }
}

/// Every class and reason a miss can have, so each series exists (at 0)
/// before its first miss and `rate()` sees that one too.
const MISSES: [(Class, Reason); 10] = [
    (Class::Message, Reason::TooLarge),
    (Class::Message, Reason::Invalid),
    (Class::Message, Reason::Registry),
    (Class::World, Reason::Unreachable),
    (Class::World, Reason::QueueFull),
    (Class::World, Reason::Timeout),
    (Class::World, Reason::RefusedAccess),
    (Class::World, Reason::Lease),
    (Class::World, Reason::Registry),
    (Class::World, Reason::Other),
];

fn failures(class: Class, reason: Reason) -> metrics::Counter {
    metrics::counter!("flotilla_relay_publish_failures_total",
        "class" => class.label(), "reason" => reason.label())
}

fn record(report: &DrainReport) {
    metrics::counter!("flotilla_relay_published_total").increment(report.published as u64);
    for (&(class, reason), &count) in &report.misses {
        failures(class, reason).increment(count as u64);
    }
}

/// Streams until `shutdown` (see the module's documentation).
pub(crate) async fn run(
    relay: &Relay,
    shutdown: &CancellationToken,
    grace: Duration,
    readiness: &Readiness,
) {
    for (class, reason) in MISSES {
        failures(class, reason).increment(0);
    }
    Stream::new(relay, readiness).run(shutdown, grace).await;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::record;
    use crate::publisher::{Class, DrainReport, Reason};

    #[test]
    fn failures_are_counted_by_class_and_reason() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let report = DrainReport {
            published: 3,
            failed: 1,
            deferred: 2,
            misses: BTreeMap::from([
                ((Class::Message, Reason::TooLarge), 1),
                ((Class::World, Reason::Timeout), 2),
            ]),
        };
        metrics::with_local_recorder(&recorder, || {
            record(&report);
            record(&report);
        });
        let rendered = handle.render();
        let value = |series: &str| {
            rendered
                .lines()
                .find_map(|line| line.strip_prefix(series))
                .map(str::trim)
                .unwrap_or_else(|| panic!("no {series}:\n{rendered}"))
                .to_owned()
        };
        assert_eq!(
            value(r#"flotilla_relay_publish_failures_total{class="message",reason="too_large"} "#),
            "2"
        );
        assert_eq!(
            value(r#"flotilla_relay_publish_failures_total{class="world",reason="timeout"} "#),
            "4"
        );
        assert_eq!(value("flotilla_relay_published_total "), "6");
    }
}
