//! Batching: concurrent callers' requests share one round trip to the
//! database.
//!
//! A caller queues its request and waits for its own answer. The first
//! caller to find nobody serving starts a serving task, which takes
//! everything queued (up to a batch), serves it, answers every caller and
//! goes on while more is queued. Under load, requests gather while a batch
//! is in flight, so one round trip carries many; alone, a request is served
//! at once (no timer, only a task hop).
//!
//! The server is a task of its own, never one of the callers: a caller
//! that served the queue would keep its own claimed job waiting (no
//! heartbeat, its lease running out) for as long as other loops kept the
//! queue busy, and a caller whose future is dropped could abandon a batch
//! half sent. A serving task that panics answers its batch with nothing
//! (`None`) and hands the rest of the queue to a new task.
//!
//! Used by group commit (`group_commit.rs`) and by batched claims
//! (`claiming/claims.rs`).

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Work whose requests can be served together.
pub(crate) trait Serve: Clone + Send + Sync + 'static {
    type Request: Send + 'static;
    type Answer: Send + 'static;
    /// Most requests one batch carries.
    const MAX_BATCH: usize;
    /// Serves a batch: one answer per request, in the requests' order.
    fn serve(&self, batch: Vec<Self::Request>) -> impl Future<Output = Vec<Self::Answer>> + Send;
}

type Waiting<S> = (<S as Serve>::Request, oneshot::Sender<<S as Serve>::Answer>);

struct Queue<S: Serve> {
    items: Vec<Waiting<S>>,
    /// Whether a serving task is running.
    serving: bool,
}

/// The queue of one kind of batched work.
pub(crate) struct Gather<S: Serve> {
    server: S,
    queue: Arc<Mutex<Queue<S>>>,
}

impl<S: Serve> Clone for Gather<S> {
    fn clone(&self) -> Self {
        Self {
            server: self.server.clone(),
            queue: self.queue.clone(),
        }
    }
}

impl<S: Serve + std::fmt::Debug> std::fmt::Debug for Gather<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gather")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl<S: Serve> Gather<S> {
    pub(crate) fn new(server: S) -> Self {
        Self {
            server,
            queue: Arc::new(Mutex::new(Queue {
                items: Vec::new(),
                serving: false,
            })),
        }
    }

    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn server_ref(&self) -> &S {
        &self.server
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue<S>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `request` and waits for its answer; `None` when the batch
    /// carrying it was abandoned (its serving task panicked or the runtime
    /// is shutting down).
    pub(crate) async fn ask(&self, request: S::Request) -> Option<S::Answer> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut queue = self.lock();
            queue.items.push((request, reply));
            !std::mem::replace(&mut queue.serving, true)
        };
        if start {
            self.start_serving();
        }
        answer.await.ok()
    }

    fn start_serving(&self) {
        let gather = self.clone();
        tokio::spawn(async move {
            let mut steward = Steward(Some(gather.clone()));
            gather.serve_queue().await;
            // Served to the end: nothing for the steward to hand on.
            steward.0 = None;
        });
    }

    /// Serves batches until the queue is empty, then stops.
    async fn serve_queue(&self) {
        loop {
            let (requests, replies): (Vec<_>, Vec<_>) = {
                let mut queue = self.lock();
                if queue.items.is_empty() {
                    queue.serving = false;
                    return;
                }
                let take = queue.items.len().min(S::MAX_BATCH);
                queue.items.drain(..take).unzip()
            };
            let answers = self.server.serve(requests).await;
            debug_assert_eq!(answers.len(), replies.len(), "one answer per request");
            for (reply, answer) in replies.into_iter().zip(answers) {
                // A caller that stopped waiting has nothing to be told.
                let _ = reply.send(answer);
            }
        }
    }
}

/// Held by a serving task; dropped only when the task panicked or was
/// cancelled mid-batch. The batch in flight is answered with nothing (its
/// senders are gone); the rest of the queue gets a new serving task, or,
/// when none can be started, the next caller starts one.
struct Steward<S: Serve>(Option<Gather<S>>);

impl<S: Serve> Drop for Steward<S> {
    fn drop(&mut self) {
        let Some(gather) = self.0.take() else {
            return;
        };
        let orphaned = {
            let mut queue = gather.lock();
            let orphaned = !queue.items.is_empty();
            queue.serving = orphaned;
            orphaned
        };
        if orphaned {
            if tokio::runtime::Handle::try_current().is_ok() {
                gather.start_serving();
            } else {
                gather.lock().serving = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Echoes each request; panics on a request of 0; waits on `gate`
    /// before each batch so a test can hold the server.
    #[derive(Clone)]
    struct Echo {
        /// Batches taken (counted before the gate).
        taken: Arc<AtomicUsize>,
        /// Batches served (counted after it).
        batches: Arc<AtomicUsize>,
        gate: Arc<tokio::sync::Semaphore>,
    }

    impl Serve for Echo {
        type Request = u32;
        type Answer = u32;
        const MAX_BATCH: usize = 4;

        async fn serve(&self, batch: Vec<u32>) -> Vec<u32> {
            self.taken.fetch_add(1, Ordering::Relaxed);
            self.gate.acquire().await.unwrap().forget();
            self.batches.fetch_add(1, Ordering::Relaxed);
            assert!(!batch.contains(&0), "request 0 panics the server");
            batch
        }
    }

    /// Waits until the server has taken its first batch.
    async fn first_batch_taken(gather: &Gather<Echo>) {
        while gather.server_ref().taken.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
    }

    fn echo(permits: usize) -> Gather<Echo> {
        Gather::new(Echo {
            taken: Arc::default(),
            batches: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(permits)),
        })
    }

    /// The first caller's answer does not wait for the batches queued
    /// behind it: it is not the one serving them.
    #[tokio::test]
    async fn the_first_caller_is_answered_after_its_own_batch_not_the_whole_queue() {
        let gather = echo(1);
        let first = tokio::spawn({
            let gather = gather.clone();
            async move { gather.ask(1).await }
        });
        first_batch_taken(&gather).await;
        // Ten more callers queue behind the first batch.
        let rest: Vec<_> = (2..12)
            .map(|n| {
                let gather = gather.clone();
                tokio::spawn(async move { gather.ask(n).await })
            })
            .collect();
        let answer = tokio::time::timeout(std::time::Duration::from_secs(5), first)
            .await
            .expect("the first caller was answered while the others' batches wait")
            .unwrap();
        assert_eq!(answer, Some(1));
        assert_eq!(gather.server_ref().batches.load(Ordering::Relaxed), 1);
        gather.server_ref().gate.add_permits(100);
        for (n, caller) in (2..12).zip(rest) {
            assert_eq!(caller.await.unwrap(), Some(n));
        }
    }

    /// A server that panics answers its own batch with nothing, and the
    /// requests queued behind it are still served.
    #[tokio::test]
    async fn a_panicking_batch_answers_nothing_and_the_queue_is_served_on() {
        let gather = echo(0);
        let poisoned = tokio::spawn({
            let gather = gather.clone();
            async move { gather.ask(0).await }
        });
        first_batch_taken(&gather).await;
        let after: Vec<_> = (1..6)
            .map(|n| {
                let gather = gather.clone();
                tokio::spawn(async move { gather.ask(n).await })
            })
            .collect();
        gather.server_ref().gate.add_permits(100);
        assert_eq!(poisoned.await.unwrap(), None);
        for (n, caller) in (1..6).zip(after) {
            assert_eq!(caller.await.unwrap(), Some(n));
        }
    }
}
