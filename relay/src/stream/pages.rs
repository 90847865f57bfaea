//! A bucket's batch as the loop sends it: planned whole (the rows' names),
//! fetched and sent a page at a time in `id` order; the page done when
//! each of its rows ended, and the batch finished after its last page.

use std::collections::HashMap;
use std::time::Duration;

use flotilla_store::outbox::relay::{self as outbox, PendingEvent, Planned, Snapshot};
use tokio::time::Instant;

use super::Stream;
use crate::publisher::Outcome;

/// A bucket's batch, sent a page at a time.
pub(super) struct Batch {
    pub(super) from: Snapshot,
    pub(super) to: Snapshot,
    pub(super) rows: Vec<Planned>,
    /// The first row not sent whole yet.
    pub(super) next: usize,
}

/// A bucket's page on its way.
pub(super) struct Page {
    /// Rows of the batch it covers.
    pub(super) planned: usize,
    /// Rows handed to the producer or ended at once.
    pub(super) sent: usize,
    pub(super) ended: usize,
    /// The world held a row back: the page goes again.
    pub(super) held_back: bool,
}

impl Stream<'_> {
    /// Plans a batch for each of `idle` without one, and fetches the next
    /// page of each batch, `room` rows in all (at least one page); returns
    /// the pages (bucket and rows of its batch covered) and their rows.
    pub(super) async fn read_pages(
        &mut self,
        idle: &[i16],
        room: usize,
    ) -> Result<(Vec<(i16, usize)>, Vec<PendingEvent>), sqlx::Error> {
        let relay = self.relay;
        let mut conn = relay.pool.acquire().await?;
        let unplanned: Vec<i16> = idle
            .iter()
            .copied()
            .filter(|b| !self.batches.contains_key(b))
            .collect();
        if !unplanned.is_empty() {
            for batch in outbox::plan(&mut conn, &unplanned).await? {
                self.batches.insert(
                    batch.bucket,
                    Batch {
                        from: batch.from,
                        to: batch.to,
                        rows: batch.rows,
                        next: 0,
                    },
                );
            }
        }
        let page_size = usize::try_from(relay.settings.batch_size).unwrap_or(usize::MAX);
        let mut pages = Vec::new();
        let mut keys = Vec::new();
        for bucket in idle {
            if keys.len() >= room {
                break;
            }
            let Some(batch) = self.batches.get(bucket) else {
                continue;
            };
            let len = relay.page_len(&batch.rows[batch.next..], page_size);
            keys.extend_from_slice(&batch.rows[batch.next..batch.next + len]);
            pages.push((*bucket, len));
        }
        let rows = if keys.is_empty() {
            Vec::new()
        } else {
            outbox::fetch(&mut conn, &keys).await?
        };
        Ok((pages, rows))
    }

    /// Hands each page's rows to the producer in order; the first row the
    /// world holds back at the hand-over stops its page.
    pub(super) async fn send_pages(
        &mut self,
        pages: Vec<(i16, usize)>,
        rows: Vec<PendingEvent>,
        window: Duration,
    ) {
        let relay = self.relay;
        let mut by_bucket: HashMap<i16, Vec<PendingEvent>> = HashMap::new();
        for row in rows {
            by_bucket.entry(row.bucket).or_default().push(row);
        }
        for (bucket, planned) in pages {
            let rows = by_bucket.remove(&bucket).unwrap_or_default();
            let mut page = Page {
                planned,
                sent: 0,
                ended: 0,
                held_back: false,
            };
            let mut at_once = Vec::new();
            for row in rows {
                // A bucket lost since the read (or possibly lost before the
                // producer would give up on the row): the page stops.
                if !relay.leases.held().holds_for(bucket, window) {
                    page.held_back = true;
                    break;
                }
                page.sent += 1;
                *self.outstanding.entry(bucket).or_default() += 1;
                match relay.publisher.dispatch(row, None).await {
                    Ok(delivery) => self.deliveries.push(delivery),
                    Err((row, outcome)) => {
                        let stop = outcome.is_deferred();
                        at_once.push((row, outcome));
                        if stop {
                            break;
                        }
                    }
                }
            }
            let empty = page.sent == 0;
            self.pages.insert(bucket, page);
            for (row, outcome) in at_once {
                self.ended(row, outcome);
            }
            if empty {
                self.page_done(bucket);
            }
        }
    }

    /// A row's send ended: recorded for the next mark, and its page done
    /// when it was the page's last.
    pub(super) fn ended(&mut self, row: PendingEvent, outcome: Outcome) {
        let bucket = row.bucket;
        let deferred = outcome.is_deferred();
        self.gathering_since.get_or_insert_with(Instant::now);
        self.marks.record(row, outcome);
        if let Some(page) = self.pages.get_mut(&bucket) {
            page.ended += 1;
            page.held_back |= deferred;
            if page.ended >= page.sent {
                self.page_done(bucket);
            }
        }
    }

    /// Every row of `bucket`'s page ended. Unless the world held one back
    /// (the page goes again after the bucket's pause), the batch moves on;
    /// after its last page the next mark moves the bucket's progress.
    fn page_done(&mut self, bucket: i16) {
        let Some(page) = self.pages.remove(&bucket) else {
            return;
        };
        if page.held_back {
            if page.sent == 0 {
                // Nothing recorded pauses it: rest here.
                let rest = Instant::now() + self.outage.next_pause();
                self.resting.insert(bucket, rest);
            }
            return;
        }
        let Some(batch) = self.batches.get_mut(&bucket) else {
            return;
        };
        batch.next += page.planned;
        if batch.next >= batch.rows.len()
            && let Some(batch) = self.batches.remove(&bucket)
        {
            self.marks.finish(bucket, batch.from, batch.to);
            *self.outstanding.entry(bucket).or_default() += 1;
            self.gathering_since.get_or_insert_with(Instant::now);
        }
    }
}
