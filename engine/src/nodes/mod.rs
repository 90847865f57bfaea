//! The steps of one segment, run as a graph: ready steps (and the items
//! of `for_each` steps) are called side by side up to the definition's
//! `parallelism`; their checkpoints are fenced writes made one at a time,
//! in the order the answers came; a step's dependants start only once its
//! checkpoint has committed (`flotilla_workflow::Frontier`). What the segment does with
//! the way they stopped is `run/segment.rs`.
//!
//! One file per step kind a workflow author writes: `call.rs` (a target's
//! call), `wait.rs` (`wait_for`), `items.rs` (`for_each`), `pages.rs`
//! (`paged`), `repeat.rs` (`repeat`), `timers.rs` (`sleep`, `until`), `child.rs` (`start`),
//! `kafka.rs` (a Kafka target); `scope.rs` is what every kind evaluates in. Executors never
//! import the operations callers ask for (`ops/`).

mod began;
mod bounds;
pub(crate) mod call;
pub(crate) mod child;
mod child_items;
pub(crate) mod items;
pub(crate) mod kafka;
mod node;
mod pages;
mod repeat;
mod scope;
pub(crate) mod timers;
mod wait;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_store::runs::Checkpoint;
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;

use crate::Engine;
use crate::nodes::began::{Began, Wait};
use crate::nodes::call::{Answer, Invocation};
use crate::nodes::child::NewChild;
use crate::nodes::items::Items;
use crate::nodes::kafka::Replies;
use crate::nodes::node::Node;
use crate::nodes::pages::begin_pages;
use crate::nodes::timers::Sleeping;
use crate::support::stored_bytes::StoredBytes;
use crate::{ClaimedRun, SegmentStop};
use flotilla_targets::{RetryClass, StepFailure};
use flotilla_workflow::CompiledWorkflow;
use flotilla_workflow::Frontier;

/// How the steps of a segment stopped.
pub(crate) enum Stop {
    LeaseLost,
    /// A step failed (the first to, `step` when a step did); the others
    /// ran to their checkpoints; `steps` are the answers so far.
    Failed {
        failure: StepFailure,
        step: Option<String>,
        steps: Map<String, Json>,
    },
    /// Nothing else could run and this external, `wait_for` or `start`
    /// step waits for its answer; the timers reached meanwhile keep their instants;
    /// `awaited`: the signals the ready `wait_for` steps wait for.
    Park {
        step: String,
        sleeping: Sleeping,
        awaited: Vec<String>,
        /// The `start` steps whose children it waits for.
        children: Vec<String>,
        /// The requests to Kafka targets it sends and the replies it waits for.
        replies: Replies,
    },
    /// Nothing else could run and these timers have not woken.
    Sleep(Sleeping),
    /// A rate-limited target has no permit before the segment's time runs
    /// out: the answers in hand were checkpointed; the job goes back to the
    /// queue until `until`, its attempt given back.
    Throttled {
        until: chrono::DateTime<chrono::Utc>,
        reason: String,
    },
    /// Someone asked to cancel the job: the calls under way were dropped
    /// (aborted) and every answer already in hand was checkpointed.
    Cancelled,
    /// The segment's deadline came after it wrote `written` checkpoints:
    /// progress, not a failure (the job goes back at once, its attempt
    /// given back); `error` says how the deadline was met.
    OutOfTime {
        error: String,
        written: usize,
    },
    /// Every step ended; `last` is the checkpoint not yet written, which
    /// goes with the completion.
    Finished {
        steps: Map<String, Json>,
        last: Option<Checkpoint>,
    },
}

/// What a segment starts from: the answers of the steps that ended, the
/// steps in the order they ended, the answers of `for_each` items whose
/// step has not ended (step → item → answer), and the pages of paged
/// steps that have not ended (step → pages stored, the last cursor).
pub(crate) struct Replayed {
    pub(crate) steps: Map<String, Json>,
    pub(crate) ended: Vec<usize>,
    pub(crate) items: HashMap<usize, BTreeMap<u32, Json>>,
    /// The digests of those steps' lists, stored with their first item.
    pub(crate) lists: HashMap<usize, String>,
    pub(crate) pages: HashMap<usize, (u32, Json)>,
    /// Repeating steps that have not ended: the calls made so far.
    pub(crate) polls: HashMap<usize, u32>,
    /// `start` steps whose child this run started already.
    pub(crate) started: HashSet<usize>,
    /// `start` steps with `for_each`: the items whose child this run
    /// started already.
    pub(crate) started_items: HashMap<usize, HashSet<usize>>,
}

/// A checkpoint's fenced write; a verdict when the step's child was not
/// started (its family is full).
type Write<'a> = BoxFuture<'a, Result<Option<StepFailure>, SegmentStop>>;

/// A call's answer, or its step's `when` saying no (`None`).
type Called<'a> = BoxFuture<'a, (Node, Result<Option<Answer>, Invocation>)>;

pub(crate) struct Nodes<'a> {
    pub(crate) engine: &'a Engine,
    pub(crate) claimed: &'a ClaimedRun,
    pub(crate) compiled: &'a Arc<CompiledWorkflow>,
    pub(crate) input: Json,
    pub(crate) started: Instant,
    pub(crate) lease_lost: &'a CancellationToken,
    /// Cancelled when a cancellation is asked of the job (the heartbeat).
    pub(crate) cancel_asked: &'a CancellationToken,
}

impl<'a> Nodes<'a> {
    pub(crate) async fn run(&self, replayed: Replayed) -> Result<Stop, SegmentStop> {
        let Replayed {
            mut steps,
            ended,
            items: mut earlier_items,
            lists: mut earlier_lists,
            pages: mut earlier_pages,
            polls: mut earlier_polls,
            mut started,
            mut started_items,
        } = replayed;
        let mut frontier = Frontier::new(&self.compiled.graph, ended);
        let parallelism = self.compiled.definition.parallelism();
        let deadline = Duration::from_millis(self.compiled.definition.deadline_ms);
        let mut calls: FuturesUnordered<Called<'_>> = FuturesUnordered::new();
        let mut answered: VecDeque<(Node, Checkpoint)> = VecDeque::new();
        let mut stored = StoredBytes::new(
            self.engine.settings().max_stored_bytes,
            &self.claimed.row().checkpoints.0,
        );
        let mut writing: Option<(Node, Checkpoint, Write<'a>)> = None;
        let mut items = Items::default();
        // Paged steps whose next page is due: (step, page, cursor).
        let mut next_pages: VecDeque<(usize, u32, Json)> = VecDeque::new();
        // The first failure, and the step it came from.
        let mut failure: Option<(StepFailure, Option<String>)> = None;
        // Whether that failure is the segment's deadline, met before the
        // next call or during one; and the checkpoints this segment wrote.
        let mut out_of_time = false;
        let mut written_count = 0usize;
        // A call a target's rate limit put off: nothing new starts.
        let mut throttled: Option<(chrono::DateTime<chrono::Utc>, String)> = None;
        let mut park_on: Option<String> = None;
        // The signals the claim found, and the names of the ready
        // `wait_for` steps that found none (a park checks them again).
        let mut pending = match wait::Pending::of(self.claimed.row()) {
            Ok(pending) => pending,
            Err(failed) => {
                return Ok(Stop::Failed {
                    failure: failed,
                    step: None,
                    steps,
                });
            }
        };
        let mut awaited: Vec<String> = Vec::new();
        // The `start` steps waiting for their children, and the children
        // to start (written one at a time with the checkpoints).
        let mut waiting_children: Vec<String> = Vec::new();
        // By step and item (`None` for a step's one child).
        let mut to_start: HashMap<(usize, Option<u32>), NewChild> = HashMap::new();
        let mut sleeping = Sleeping::default();
        let mut replies = Replies::default();
        let mut cancelling = false;
        let mut converted = scope::Converted::default();
        'segment: loop {
            if self.lease_lost.is_cancelled() {
                return Ok(Stop::LeaseLost);
            }
            if cancelling && calls.is_empty() && writing.is_none() && answered.is_empty() {
                return Ok(Stop::Cancelled);
            }
            while !cancelling
                && failure.is_none()
                && throttled.is_none()
                && calls.len() < parallelism
            {
                let Some(left) = deadline
                    .checked_sub(self.started.elapsed())
                    .filter(|d| !d.is_zero())
                else {
                    let error = format!(
                        "segment exceeded its deadline of {} ms before its next step",
                        deadline.as_millis()
                    );
                    failure = Some((StepFailure::retryable(RetryClass::Deadline, error), None));
                    out_of_time = true;
                    break;
                };
                // Pages and items of a step under way go before new steps.
                if let Some((step, page, cursor)) = next_pages.pop_front() {
                    let node = Node {
                        page: Some(page),
                        ..Node::step(step)
                    };
                    let scope = self
                        .scope(step, &steps, &mut converted)
                        .with("cursor", &cursor);
                    calls.push(Box::pin(self.call(node, scope, (left, deadline))));
                    continue;
                }
                if let Some((step, item, scope)) = items.next_call() {
                    let node = Node {
                        item: Some(item),
                        ..Node::step(step)
                    };
                    calls.push(Box::pin(self.call(node, scope, (left, deadline))));
                    continue;
                }
                let Some(index) = frontier.start_next() else {
                    break;
                };
                let step = &self.compiled.steps[index];
                let name = step.definition.name.clone();
                let node = Node::step(index);
                // One executor per step kind; what it came to is applied here.
                let began = if let Some(signal) = &step.definition.wait_for {
                    let scope = self.scope(index, &steps, &mut converted);
                    self.begin_wait(index, signal, &scope, &mut pending).await
                } else if let Some(start) = &step.definition.start {
                    let scope = self.scope(index, &steps, &mut converted);
                    if step.for_each.is_some() {
                        self.begin_children(index, start, scope, started_items.get(&index))
                            .await
                    } else {
                        self.begin_start(index, start, &scope, started.contains(&index))
                            .await
                    }
                } else if let Some(target) = self.engine.targets().kafka(&step.definition.target) {
                    let target = target.clone();
                    let scope = self.scope(index, &steps, &mut converted);
                    self.begin_kafka(index, &scope, &target, writing.is_none())
                        .await
                } else if step.definition.is_external() {
                    // Parked on once nothing else can run; another
                    // external step ready meanwhile waits for a later
                    // segment.
                    Began::Waits(Wait::Answer)
                } else {
                    let scope = self.scope(index, &steps, &mut converted);
                    if step.timer.is_some() {
                        self.begin_timer(index, &scope).await?
                    } else if step.for_each.is_some() {
                        let earlier = (&mut earlier_items, &mut earlier_lists);
                        self.begin_items(index, scope, &mut items, earlier).await
                    } else if step.definition.paged {
                        begin_pages(node, scope, &mut earlier_pages)
                    } else if step.repeat.is_some() {
                        self.begin_repeat(node, scope, &mut earlier_polls)
                    } else {
                        Began::Call(node, scope)
                    }
                };
                let (began, wait_ends) = self.bounded(index, began).await?;
                if let Some((key, at, new)) = wait_ends {
                    // The park wakes at the wait's deadline.
                    sleeping.add(key, at, new);
                }
                match began {
                    Began::Answer(checkpoint) => answered.push_back((node, checkpoint)),
                    Began::Failed(failed) => failure = Some((failed, Some(name))),
                    Began::Waits(wait) => {
                        match wait {
                            Wait::Signal(signal) => awaited.push(signal),
                            Wait::Child(keys) => waiting_children.extend(keys),
                            Wait::Reply(deadline) => replies.wait(name.clone(), deadline),
                            Wait::Send(request) => replies.send(*request),
                            Wait::Answer => {}
                        }
                        park_on.get_or_insert(name);
                    }
                    Began::StartChild(child, checkpoint) => {
                        to_start.insert((index, None), child);
                        answered.push_back((node, checkpoint));
                    }
                    Began::StartChildren(children, running) => {
                        waiting_children.extend(running);
                        for (child, checkpoint) in children {
                            to_start.insert((index, checkpoint.item), child);
                            let item = checkpoint.item.map(|i| i as usize);
                            answered.push_back((Node { item, ..node }, checkpoint));
                        }
                    }
                    Began::Sleeps { at, new } => sleeping.add(name, at, new),
                    Began::Call(node, scope) => {
                        calls.push(Box::pin(self.call(node, scope, (left, deadline))));
                    }
                    Began::Items => {}
                    // The lease lost or a cancel asked while it waited for
                    // a slot: the loop's top acts on it.
                    Began::Interrupted => {
                        if self.cancel_asked.is_cancelled() {
                            cancelling = true;
                            calls = FuturesUnordered::new();
                        }
                        continue 'segment;
                    }
                }
            }
            if calls.is_empty() && writing.is_none() {
                let unwritten = answered.len();
                if unwritten == 0 {
                    if let Some((failed, _)) = &failure
                        && out_of_time
                        && written_count > 0
                    {
                        return Ok(Stop::OutOfTime {
                            error: failed.to_string(),
                            written: written_count,
                        });
                    }
                    if let (None, Some((until, reason))) = (&failure, throttled) {
                        return Ok(Stop::Throttled { until, reason });
                    }
                    return Ok(if let Some((failure, step)) = failure {
                        Stop::Failed {
                            failure,
                            step,
                            steps,
                        }
                    } else if let Some(step) = park_on {
                        Stop::Park {
                            step,
                            sleeping,
                            awaited,
                            children: waiting_children,
                            replies,
                        }
                    } else if !sleeping.is_empty() {
                        Stop::Sleep(sleeping)
                    } else if frontier.all_ended() {
                        Stop::Finished { steps, last: None }
                    } else {
                        Stop::Failed {
                            failure: StepFailure::Defect(
                                "no step of the workflow can start (a step's needs never end)"
                                    .into(),
                            ),
                            step: None,
                            steps,
                        }
                    });
                }
                let (node, next) = &answered[0];
                if unwritten == 1
                    && !cancelling
                    && failure.is_none()
                    && park_on.is_none()
                    && next.item.is_none()
                    && next.page.is_none()
                    && next.poll.is_none()
                    && next.child.is_none()
                    && frontier.is_last(node.step)
                {
                    // The last checkpoint goes with the completion.
                    let (_, last) = answered.pop_front().expect("one answer waits");
                    if let Err(over) = stored.admit(&last) {
                        failure.get_or_insert((over, Some(last.name)));
                        continue;
                    }
                    if !last.skipped {
                        steps.insert(last.name.clone(), last.response.clone());
                    }
                    return Ok(Stop::Finished {
                        steps,
                        last: Some(last),
                    });
                }
            }
            if writing.is_none()
                && let Some((node, checkpoint)) = answered.pop_front()
            {
                if let Err(over) = stored.admit(&checkpoint) {
                    // Nothing more is stored: the calls under way are
                    // dropped, the answers in hand left unwritten.
                    failure.get_or_insert((over, Some(checkpoint.name)));
                    answered.clear();
                    calls = FuturesUnordered::new();
                    continue;
                }
                let claimed = self.claimed;
                let write = checkpoint.clone();
                let child = checkpoint
                    .child
                    .and_then(|_| to_start.remove(&(node.step, checkpoint.item)));
                writing = Some((
                    node,
                    checkpoint,
                    Box::pin(async move {
                        match child {
                            Some(child) => {
                                claimed.start_child(&write.name, write.item, child).await
                            }
                            None => claimed.checkpoint(&write).await.map(|()| None),
                        }
                    }),
                ));
            }
            tokio::select! {
                // Cancellation asked: the calls under way are dropped (the
                // target sees its request aborted); answers in hand are
                // still checkpointed, and nothing new starts.
                () = self.cancel_asked.cancelled(), if !cancelling => {
                    cancelling = true;
                    calls = FuturesUnordered::new();
                    // No child is started for a job being cancelled (review
                    // L7): it would be created only to be cancelled.
                    answered.retain(|(_, checkpoint)| checkpoint.child.is_none());
                    to_start.clear();
                }
                Some((node, called)) = calls.next(), if !calls.is_empty() => match called {
                    Ok(answer) => {
                        let name = self.compiled.steps[node.step].definition.name.clone();
                        let (response, call) = answer.map_or((None, None), |a| (Some(a.response), a.call));
                        let not_yet = match (node.poll, &response) {
                            (Some(_), Some(answer)) => {
                                let scope = self.scope(node.step, &steps, &mut converted);
                                match self.repeat_done(node.step, scope, answer).await {
                                    Ok(done) => !done,
                                    Err(failed) => {
                                        failure.get_or_insert((failed, Some(name)));
                                        continue;
                                    }
                                }
                            }
                            _ => false,
                        };
                        match (node.page, response) {
                            (Some(page), Some(answer)) if answer.get("more") == Some(&Json::Bool(true)) => {
                                match self.next_page(node, page, &answer) {
                                    Ok(kept) => answered.push_back((node, kept)),
                                    Err(failed) => {
                                        failure.get_or_insert((failed, Some(name)));
                                    }
                                }
                            }
                            (_, Some(_)) if not_yet => {
                                let poll = node.poll.unwrap_or(0);
                                let mut kept = checkpoint(name, None, Some(serde_json::json!({ "calls": poll + 1 })));
                                kept.poll = Some(poll);
                                kept.call = call;
                                answered.push_back((node, kept));
                            }
                            (_, response) => {
                                let mut kept = checkpoint(name, node.item, response);
                                kept.call = call;
                                if node.item.is_some() {
                                    // Checkpoints are written in answer order:
                                    // the first item answered is written first.
                                    kept.list = items.take_list_digest(node.step);
                                }
                                answered.push_back((Node { page: None, poll: None, ..node }, kept));
                            }
                        }
                    }
                    Err(Invocation::LeaseLost) => return Ok(Stop::LeaseLost),
                    Err(Invocation::Throttled { until, reason }) => {
                        throttled.get_or_insert((until, reason));
                    }
                    // The calls still running go on to their checkpoints;
                    // nothing new starts.
                    Err(Invocation::Failed(failed)) => {
                        let name = self.compiled.steps[node.step].definition.name.clone();
                        if failure.is_none() {
                            // A call cut by the segment's deadline, not by
                            // its own timeout.
                            out_of_time = matches!(
                                failed,
                                StepFailure::Retryable { class: RetryClass::Timeout | RetryClass::Deadline, .. }
                            ) && self.started.elapsed() >= deadline;
                            failure = Some((failed, Some(name)));
                        }
                    }
                },
                written = async { (&mut writing.as_mut().expect("polled only while writing").2).await },
                    if writing.is_some() =>
                {
                    let (node, checkpoint, _) = writing.take().expect("a write was under way");
                    if let Some(refused) = written? {
                        failure.get_or_insert((refused, Some(checkpoint.name)));
                        continue;
                    }
                    written_count += 1;
                    if checkpoint.child.is_some() {
                        // The child is under way: the step waits for it.
                        match checkpoint.item {
                            Some(item) => {
                                started_items.entry(node.step).or_default().insert(item as usize);
                            }
                            None => {
                                started.insert(node.step);
                            }
                        }
                        // The key its outcome reaches the row under.
                        let key = checkpoint.item.map_or_else(
                            || checkpoint.name.clone(),
                            |item| child::item_key(&checkpoint.name, item as usize),
                        );
                        waiting_children.push(key);
                        park_on.get_or_insert(checkpoint.name);
                        continue;
                    }
                    if let Some(item) = node.item {
                        metrics::counter!("flotilla_items_done_total").increment(1);
                        if let Some(all) = items.answered(node.step, item, checkpoint.response) {
                            answered.push_back((Node::step(node.step), self::checkpoint(checkpoint.name, None, Some(all))));
                        }
                        continue;
                    }
                    if checkpoint.poll.is_some() {
                        // Not yet: the next call waits its pause, asleep.
                        let at = self.next_poll(node.step, &checkpoint.name).await?;
                        sleeping.add(checkpoint.name, at, false);
                        continue;
                    }
                    if let Some(page) = checkpoint.page {
                        // The cursor is durable: the next page may be fetched.
                        let cursor = checkpoint.response.get("cursor").cloned().unwrap_or(Json::Null);
                        next_pages.push_back((node.step, page + 1, cursor));
                        continue;
                    }
                    if !checkpoint.skipped {
                        steps.insert(checkpoint.name, checkpoint.response);
                    }
                    frontier.end(node.step);
                }
            }
        }
    }
}

/// The checkpoint of a step (or of one of its items): its answer, or a
/// skip when there is none.
fn checkpoint(name: String, item: Option<usize>, response: Option<Json>) -> Checkpoint {
    Checkpoint {
        name,
        skipped: response.is_none(),
        response: response.unwrap_or(Json::Null),
        item: item.and_then(|i| u32::try_from(i).ok()),
        page: None,
        signal: None,
        child: None,
        list: None,
        timed_out: false,
        call: None,
        poll: None,
    }
}
