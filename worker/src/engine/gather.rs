//! Leader/follower batching: concurrent callers' requests share one round
//! trip to the database.
//!
//! A caller queues its request and waits for its own answer. When no batch
//! is being served, the caller that arrives becomes the leader: it takes
//! everything queued (up to a batch), serves it, answers every caller, and
//! goes on while more is queued. Under load, requests gather while a batch
//! is in flight, so one round trip carries many; alone, a request is served
//! at once (no timer, no added latency). A leader whose future is dropped
//! mid-batch hands the queue to a task, so no caller waits for an answer
//! nobody will give.
//!
//! Used by group commit (`group_commit.rs`) and by batched claims
//! (`claims.rs`).

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Work whose requests can be served together.
pub(super) trait Serve: Clone + Send + Sync + 'static {
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
    leading: bool,
}

/// The queue of one kind of batched work.
pub(super) struct Gather<S: Serve> {
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
    pub(super) fn new(server: S) -> Self {
        Self {
            server,
            queue: Arc::new(Mutex::new(Queue {
                items: Vec::new(),
                leading: false,
            })),
        }
    }

    #[cfg(test)]
    pub(super) fn server(&self) -> &S {
        &self.server
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue<S>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `request` and waits for its answer; `None` when the batch
    /// carrying it was abandoned (its serving task died).
    pub(super) async fn ask(&self, request: S::Request) -> Option<S::Answer> {
        let (reply, answer) = oneshot::channel();
        let lead = {
            let mut queue = self.lock();
            queue.items.push((request, reply));
            !std::mem::replace(&mut queue.leading, true)
        };
        if lead {
            self.lead().await;
        }
        answer.await.ok()
    }

    /// Serves batches until the queue is empty, then steps down.
    async fn lead(&self) {
        let mut guard = Leadership(Some(self.clone()));
        loop {
            let (requests, replies): (Vec<_>, Vec<_>) = {
                let mut queue = self.lock();
                if queue.items.is_empty() {
                    queue.leading = false;
                    guard.0 = None;
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

/// Held by the leader; if its future is dropped before the queue is empty,
/// a task takes over, so queued callers still get their answers.
struct Leadership<S: Serve>(Option<Gather<S>>);

impl<S: Serve> Drop for Leadership<S> {
    fn drop(&mut self) {
        let Some(gather) = self.0.take() else {
            return;
        };
        let orphaned = {
            let mut queue = gather.lock();
            if queue.items.is_empty() {
                queue.leading = false;
                false
            } else {
                true
            }
        };
        if orphaned && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { gather.lead().await });
        } else if orphaned {
            gather.lock().leading = false;
        }
    }
}
