//! The steps of one segment, run as a graph: ready steps (and the items
//! of `for_each` steps) are called side by side up to the definition's
//! `parallelism`; their checkpoints are fenced writes made one at a time,
//! in the order the answers came; a step's dependants start only once its
//! checkpoint has committed (`flotilla_workflow::Frontier`). What the segment does with
//! the way they stopped is `run/segment.rs`.
//!
//! One file per step kind a workflow author writes: `call.rs` (a target's
//! call), `items.rs` (`for_each`), `timers.rs` (`sleep`, `until`),
//! `child.rs` (`start`), `kafka.rs` (a Kafka target). Executors never
//! import the operations callers ask for (`ops/`).

pub(crate) mod call;
pub(crate) mod child;
pub(crate) mod items;
pub(crate) mod kafka;
pub(crate) mod timers;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_store::runs::signals::{self, SignalEntry};
use flotilla_store::runs::{Checkpoint, RunRow};
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;

use crate::Engine;
use crate::child_id;
use crate::nodes::call::{Invocation, over_budget};
use crate::nodes::child::{ChildState, NewChild, may_start_at};
use crate::nodes::items::Items;
use crate::nodes::kafka::{KafkaStep, Replies};
use crate::nodes::timers::Sleeping;
use crate::support::digest::list_digest;
use crate::support::judge::check_response;
use crate::support::stored_bytes::StoredBytes;
use crate::{ClaimedRun, SegmentStop};
use flotilla_targets::kafka::KafkaTarget;
use flotilla_targets::{RetryClass, StepFailure};
use flotilla_workflow::CompiledWorkflow;
use flotilla_workflow::Frontier;
use flotilla_workflow::assemble;
use flotilla_workflow::expr::{Cel, Scope, to_cel};

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
    /// `start` steps whose child this run started already.
    pub(crate) started: HashSet<usize>,
}

/// A step, one item of a `for_each` step, or one page of a paged step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Node {
    step: usize,
    item: Option<usize>,
    page: Option<u32>,
}

impl Node {
    fn step(step: usize) -> Self {
        Self {
            step,
            item: None,
            page: None,
        }
    }

    /// The part of its step this call is, as its idempotency key says it.
    fn part(self) -> Option<String> {
        match (self.item, self.page) {
            (Some(item), _) => Some(format!("item-{item}")),
            (None, Some(page)) => Some(format!("page-{page}")),
            (None, None) => None,
        }
    }

    /// Whether this call is the step's first (its `when` decides).
    fn is_first(self) -> bool {
        self.item.is_none() && self.page.unwrap_or(0) == 0
    }
}

/// The segment's input and answers converted to CEL, each once.
#[derive(Default)]
struct Converted {
    input: Option<Cel>,
    answers: HashMap<String, Cel>,
}

/// A checkpoint's fenced write; a verdict when the step's child was not
/// started (its family is full).
type Write<'a> = BoxFuture<'a, Result<Option<StepFailure>, SegmentStop>>;

/// A call's answer, or its step's `when` saying no (`None`).
type Called<'a> = BoxFuture<'a, (Node, Result<Option<Json>, Invocation>)>;

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
            mut started,
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
        let mut park_on: Option<String> = None;
        // The signals the claim found, and the names of the ready
        // `wait_for` steps that found none (a park checks them again).
        let mut pending = match Pending::of(self.claimed.row()) {
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
        let mut to_start: HashMap<usize, NewChild> = HashMap::new();
        let mut sleeping = Sleeping::default();
        let mut replies = Replies::default();
        let mut cancelling = false;
        let mut converted = Converted::default();
        'segment: loop {
            if self.lease_lost.is_cancelled() {
                return Ok(Stop::LeaseLost);
            }
            if cancelling && calls.is_empty() && writing.is_none() && answered.is_empty() {
                return Ok(Stop::Cancelled);
            }
            while !cancelling && failure.is_none() && calls.len() < parallelism {
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
                if let Some(signal) = &step.definition.wait_for {
                    let scope = self.scope(index, &steps, &mut converted);
                    match self.holds(index, &scope).await {
                        Ok(false) => answered.push_back((node, checkpoint(name, None, None))),
                        Ok(true) => match pending.take(signal) {
                            Some((seq, payload)) => {
                                match self.judge(index, &payload, &scope).await {
                                    Ok(()) => {
                                        let mut taken = checkpoint(name, None, Some(payload));
                                        taken.signal = Some(seq);
                                        answered.push_back((node, taken));
                                    }
                                    Err(failed) => failure = Some((failed, Some(name))),
                                }
                            }
                            None => {
                                awaited.push(signal.clone());
                                park_on.get_or_insert(name);
                            }
                        },
                        Err(failed) => failure = Some((failed, Some(name))),
                    }
                    continue;
                }
                if let Some(start) = &step.definition.start {
                    let scope = self.scope(index, &steps, &mut converted);
                    match self.holds(index, &scope).await {
                        Ok(false) => answered.push_back((node, checkpoint(name, None, None))),
                        Ok(true) => {
                            let state = self
                                .engine
                                .child_state_now(
                                    self.claimed.row(),
                                    &name,
                                    started.contains(&index),
                                )
                                .await;
                            match state {
                                Ok(ChildState::Completed(result)) => match self
                                    .judge(index, &result, &scope)
                                    .await
                                {
                                    Ok(()) => answered
                                        .push_back((node, checkpoint(name, None, Some(result)))),
                                    Err(failed) => failure = Some((failed, Some(name))),
                                },
                                Ok(ChildState::Failed(failed)) => {
                                    failure = Some((failed, Some(name)))
                                }
                                Ok(ChildState::Running) => {
                                    waiting_children.push(name.clone());
                                    park_on.get_or_insert(name);
                                }
                                Ok(ChildState::NotStarted) => {
                                    match self.child_input(index, &scope).await.and_then(|input| {
                                        may_start_at(self.claimed.row().depth).map(|()| input)
                                    }) {
                                        Ok(input) => {
                                            to_start.insert(
                                                index,
                                                NewChild {
                                                    workflow: start.workflow.clone(),
                                                    input,
                                                    cancel_with_parent: step
                                                        .definition
                                                        .cancel_children
                                                        != Some(false),
                                                },
                                            );
                                            let id = child_id(self.claimed.job_id(), &name);
                                            let mut begun = checkpoint(
                                                name,
                                                None,
                                                Some(serde_json::json!({ "child_job_id": id })),
                                            );
                                            begun.child = Some(id);
                                            answered.push_back((node, begun));
                                        }
                                        Err(failed) => failure = Some((failed, Some(name))),
                                    }
                                }
                                Err(failed) => failure = Some((failed, Some(name))),
                            }
                        }
                        Err(failed) => failure = Some((failed, Some(name))),
                    }
                    continue;
                }
                if let Some(target) = self.engine.targets().kafka(&step.definition.target) {
                    let target = target.clone();
                    let scope = self.scope(index, &steps, &mut converted);
                    match self.holds(index, &scope).await {
                        Ok(false) => answered.push_back((node, checkpoint(name, None, None))),
                        Ok(true) => match self
                            .kafka_step(index, &scope, &target, writing.is_none())
                            .await
                        {
                            Ok(KafkaStep::Answered(result)) => {
                                match self.judge(index, &result, &scope).await {
                                    Ok(()) => answered
                                        .push_back((node, checkpoint(name, None, Some(result)))),
                                    Err(failed) => failure = Some((failed, Some(name))),
                                }
                            }
                            Ok(KafkaStep::Failed(failed)) => failure = Some((failed, Some(name))),
                            Ok(KafkaStep::Waiting(deadline)) => {
                                replies.wait(name.clone(), deadline);
                                park_on.get_or_insert(name);
                            }
                            Ok(KafkaStep::Send(request)) => {
                                replies.send(*request);
                                park_on.get_or_insert(name);
                            }
                            // The lease lost or a cancel asked while it
                            // waited for a slot: the loop's top acts on it.
                            Ok(KafkaStep::Interrupted) => {
                                if self.cancel_asked.is_cancelled() {
                                    cancelling = true;
                                    calls = FuturesUnordered::new();
                                }
                                continue 'segment;
                            }
                            Err(failed) => failure = Some((failed, Some(name))),
                        },
                        Err(failed) => failure = Some((failed, Some(name))),
                    }
                    continue;
                }
                if step.definition.is_external() {
                    // Parked on once nothing else can run; another
                    // external step ready meanwhile waits for a later
                    // segment.
                    park_on.get_or_insert(name);
                    continue;
                }
                let scope = self.scope(index, &steps, &mut converted);
                if step.timer.is_some() {
                    // A timer calls nothing: woken, it is checkpointed like
                    // an answer; not yet, the job sleeps once nothing else
                    // can run.
                    match timers::wakes_at(
                        self.engine,
                        self.claimed,
                        (self.compiled, index),
                        &scope,
                    )
                    .await
                    {
                        Ok((at, _)) if at <= self.engine.now() => {
                            let response = serde_json::json!({ "woke_at": timers::instant(at) });
                            answered.push_back((node, checkpoint(name, None, Some(response))));
                        }
                        Ok((at, new)) => {
                            if new {
                                // Stored at once: the instant counts from
                                // now, whatever ends this segment.
                                self.claimed.keep_timer(&name, &timers::instant(at)).await?;
                            }
                            sleeping.add(name, at, new);
                        }
                        Err(failed) => failure = Some((failed, Some(name))),
                    }
                    continue;
                }
                if step.for_each.is_some() {
                    match self.list(index, &scope).await {
                        Ok(None) => answered.push_back((node, checkpoint(name, None, None))),
                        Ok(Some((list, digest))) => {
                            let before = earlier_items.remove(&index);
                            // Answers are kept by index: a list other than the
                            // one they answered would give them to other items.
                            let to_store = match earlier_lists.remove(&index) {
                                Some(stored) if stored != digest => {
                                    let failed = StepFailure::Defect(format!(
                                        "step {name}: for_each gave a different list from the one \
                                         its answered items were called over (a for_each list must \
                                         be the same on every segment)"
                                    ));
                                    failure = Some((failed, Some(name)));
                                    continue;
                                }
                                // Stored with the first item, in a run that
                                // only releases reading digests claim.
                                None if before.is_none()
                                    && self.claimed.row().reader_level
                                        >= flotilla_store::runs::FOR_EACH_READER_LEVEL =>
                                {
                                    Some(digest)
                                }
                                _ => None,
                            };
                            if let Some(all) = items.start(index, scope, (list, to_store), before) {
                                answered.push_back((node, checkpoint(name, None, Some(all))));
                            }
                        }
                        Err(failed) => failure = Some((failed, Some(step.definition.name.clone()))),
                    }
                    continue;
                }
                if step.definition.paged {
                    // From the first page, or the one after the last cursor stored.
                    let (page, cursor) = earlier_pages.remove(&index).unwrap_or((0, Json::Null));
                    let node = Node {
                        page: Some(page),
                        ..node
                    };
                    let scope = scope.with("cursor", &cursor);
                    calls.push(Box::pin(self.call(node, scope, (left, deadline))));
                    continue;
                }
                calls.push(Box::pin(self.call(node, scope, (left, deadline))));
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
                let child = checkpoint.child.and_then(|_| to_start.remove(&node.step));
                writing = Some((
                    node,
                    checkpoint,
                    Box::pin(async move {
                        match child {
                            Some(child) => claimed.start_child(&write.name, child).await,
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
                    Ok(response) => {
                        let name = self.compiled.steps[node.step].definition.name.clone();
                        match (node.page, response) {
                            (Some(page), Some(answer)) if answer.get("more") == Some(&Json::Bool(true)) => {
                                let most = self.compiled.steps[node.step].definition.max_pages();
                                match answer.get("cursor") {
                                    Some(_) if page.saturating_add(1) >= most => {
                                        let failed = StepFailure::Verdict {
                                            message: format!(
                                                "step {name}: page {page} says more: true, but the step fetches at most {most} pages (max_pages)"
                                            ),
                                            violations: vec![format!("max_pages: {most}")],
                                        };
                                        failure.get_or_insert((failed, Some(name)));
                                    }
                                    Some(cursor) => {
                                        let mut kept = checkpoint(name, None, Some(serde_json::json!({ "cursor": cursor })));
                                        kept.page = Some(page);
                                        answered.push_back((node, kept));
                                    }
                                    None => {
                                        let failed = StepFailure::Defect(format!(
                                            "step {name}: page {page} says more: true without a cursor"
                                        ));
                                        failure.get_or_insert((failed, Some(name)));
                                    }
                                }
                            }
                            (_, response) => {
                                let mut kept = checkpoint(name, node.item, response);
                                if node.item.is_some() {
                                    // Checkpoints are written in answer order:
                                    // the first item answered is written first.
                                    kept.list = items.take_list_digest(node.step);
                                }
                                answered.push_back((Node { page: None, ..node }, kept));
                            }
                        }
                    }
                    Err(Invocation::LeaseLost) => return Ok(Stop::LeaseLost),
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
                    if let Some(item) = node.item {
                        metrics::counter!("flotilla_items_done_total").increment(1);
                        if let Some(all) = items.answered(node.step, item, checkpoint.response) {
                            answered.push_back((Node::step(node.step), self::checkpoint(checkpoint.name, None, Some(all))));
                        }
                        continue;
                    }
                    if checkpoint.child.is_some() {
                        // The child is under way: the step waits for it.
                        started.insert(node.step);
                        waiting_children.push(checkpoint.name.clone());
                        park_on.get_or_insert(checkpoint.name);
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

    /// What step `index` sees: `input` and the answers of its ancestors.
    /// Each answer is converted to CEL once per segment (`converted`, by
    /// step; an answer never changes once given), so a long graph costs
    /// one conversion per answer, not one per answer per later step.
    fn scope(&self, index: usize, steps: &Map<String, Json>, converted: &mut Converted) -> Scope {
        let input = converted
            .input
            .get_or_insert_with(|| to_cel(&self.input))
            .clone();
        let mut ancestors = HashMap::new();
        for (name, answer) in steps {
            let ancestor = self
                .compiled
                .step_index(name)
                .is_some_and(|j| self.compiled.graph.is_ancestor(j, index));
            if ancestor {
                let cel = converted
                    .answers
                    .entry(name.clone())
                    .or_insert_with(|| to_cel(answer));
                ancestors.insert(name.clone(), cel.clone());
            }
        }
        Scope::default()
            .with_cel("input", input)
            .with_cel("steps", Cel::from(ancestors))
    }

    /// The input of step `index`'s child, built by its `start.input`.
    async fn child_input(&self, index: usize, scope: &Scope) -> Result<Json, StepFailure> {
        let built = {
            let (compiled, scope) = (self.compiled.clone(), scope.clone());
            self.engine
                .off_runtime(move || assemble(&compiled.steps[index].rules, &scope))
                .await
        };
        let name = &self.compiled.steps[index].definition.name;
        match built {
            Ok(Ok(input)) => Ok(input),
            Ok(Err(e)) => Err(StepFailure::Defect(format!(
                "step {name}: building the child's input: {e}"
            ))),
            Err(exhausted) => Err(over_budget(name, "building the child's input", &exhausted)),
        }
    }

    /// Where Kafka step `index` stands for this attempt; when this attempt
    /// has sent no request, the request to send with the park.
    async fn kafka_step(
        &self,
        index: usize,
        scope: &Scope,
        target: &KafkaTarget,
        may_wait: bool,
    ) -> Result<KafkaStep, StepFailure> {
        let step = &self.compiled.steps[index];
        let name = &step.definition.name;
        if step.for_each.is_some() || step.definition.paged {
            return Err(StepFailure::Defect(format!(
                "step {name}: a Kafka target is not called per item or by pages"
            )));
        }
        let now = self.engine.now();
        if let Some(state) = crate::nodes::kafka::state_of(self.claimed.row(), name, now)? {
            return Ok(state);
        }
        let built = {
            let (compiled, scope) = (self.compiled.clone(), scope.clone());
            self.engine
                .off_runtime(move || assemble(&compiled.steps[index].rules, &scope))
                .await
        };
        let request = match built {
            Ok(Ok(request)) => request,
            Ok(Err(e)) => {
                return Err(StepFailure::Defect(format!(
                    "step {name}: building the request: {e}"
                )));
            }
            Err(exhausted) => return Err(over_budget(name, "building the request", &exhausted)),
        };
        // A capped target: the request's clock starts once its slot is
        // taken. With a checkpoint write under way (its transaction holds
        // the job's row, which the heartbeat renews) it tries once only.
        let correlation_id = uuid::Uuid::new_v4();
        let now = match target.max_concurrent {
            None => now,
            Some(cap) => {
                let patience = Duration::from_millis(self.compiled.definition.deadline_ms)
                    .saturating_sub(self.started.elapsed());
                let timeout =
                    crate::nodes::kafka::reply_timeout(step.definition.timeout_ms, target);
                let wait = crate::nodes::kafka::SlotWait {
                    target: &step.definition.target,
                    cap,
                    step: name,
                    correlation_id,
                    timeout,
                    patience: if may_wait {
                        patience.min(timeout)
                    } else {
                        Duration::ZERO
                    },
                    interrupt: (self.lease_lost, self.cancel_asked),
                };
                match self.engine.slot_for(self.claimed.job_id(), wait).await? {
                    Some(taken_at) => taken_at,
                    None => return Ok(KafkaStep::Interrupted),
                }
            }
        };
        let request = crate::nodes::kafka::outgoing(
            self.claimed.row(),
            (name, step.definition.timeout_ms),
            (target, self.engine.targets().fleet_encoding()),
            (request, self.engine.settings().max_event_bytes),
            (now, correlation_id),
        )?;
        Ok(KafkaStep::Send(Box::new(request)))
    }

    /// Judges a signal's payload as step `index`'s answer.
    async fn judge(&self, index: usize, payload: &Json, scope: &Scope) -> Result<(), StepFailure> {
        let judged = {
            let (compiled, scope, payload) =
                (self.compiled.clone(), scope.clone(), payload.clone());
            self.engine
                .off_runtime(move || check_response(&compiled.steps[index], &payload, &scope))
                .await
        };
        let name = &self.compiled.steps[index].definition.name;
        judged.unwrap_or_else(|exhausted| Err(over_budget(name, "judging the signal", &exhausted)))
    }

    /// Whether step `index` runs: its `when` over `scope` (true without one).
    async fn holds(&self, index: usize, scope: &Scope) -> Result<bool, StepFailure> {
        let step = &self.compiled.steps[index];
        if step.when.is_none() {
            return Ok(true);
        }
        let holds = {
            let (compiled, scope) = (self.compiled.clone(), scope.clone());
            self.engine
                .off_runtime(move || {
                    compiled.steps[index]
                        .when
                        .as_ref()
                        .map_or(Ok(true), |when| when.evaluate_bool(&scope))
                })
                .await
        };
        let name = &step.definition.name;
        match holds {
            Ok(Ok(holds)) => Ok(holds),
            Ok(Err(e)) => Err(StepFailure::Defect(format!("step {name}: when: {e}"))),
            Err(exhausted) => Err(over_budget(name, "evaluating when", &exhausted)),
        }
    }

    /// The items of `for_each` step `index` and their digest, or `None`
    /// when its `when` skips it. More items than the step allows is the
    /// job's verdict.
    async fn list(
        &self,
        index: usize,
        scope: &Scope,
    ) -> Result<Option<(Vec<Json>, String)>, StepFailure> {
        if !self.holds(index, scope).await? {
            return Ok(None);
        }
        let step = &self.compiled.steps[index];
        let name = &step.definition.name;
        let listed = {
            let (compiled, scope) = (self.compiled.clone(), scope.clone());
            self.engine
                .off_runtime(move || {
                    let listed = compiled.steps[index]
                        .for_each
                        .as_ref()
                        .map_or(Ok(Json::Array(Vec::new())), |list| list.evaluate(&scope))?;
                    // Not a list: given back whole, for the error.
                    Ok::<_, String>(match listed {
                        Json::Array(list) => {
                            let digest = list_digest(&list);
                            Ok((list, digest))
                        }
                        other => Err(other),
                    })
                })
                .await
        };
        let listed = match listed {
            Ok(Ok(listed)) => listed,
            Ok(Err(e)) => return Err(StepFailure::Defect(format!("step {name}: for_each: {e}"))),
            Err(exhausted) => return Err(over_budget(name, "evaluating for_each", &exhausted)),
        };
        let (list, digest) = listed.map_err(|other| {
            StepFailure::Defect(format!(
                "step {name}: for_each gave {}, not a list",
                kind(&other)
            ))
        })?;
        let most = step.definition.max_items();
        if list.len() > most {
            let message = format!(
                "step {name}: for_each gave {} items, over its max_items of {most}",
                list.len()
            );
            return Err(StepFailure::Verdict {
                violations: vec![message.clone()],
                message,
            });
        }
        Ok(Some((list, digest)))
    }

    /// A step's call (its `when` first), or one item's.
    async fn call(
        &self,
        node: Node,
        scope: Scope,
        (left, deadline): (Duration, Duration),
    ) -> (Node, Result<Option<Json>, Invocation>) {
        let _running = Running::new();
        if node.is_first() {
            match self.holds(node.step, &scope).await {
                Ok(true) => {}
                Ok(false) => return (node, Ok(None)),
                Err(failed) => return (node, Err(Invocation::Failed(failed))),
            }
        }
        let called = self
            .engine
            .invoke(
                self.claimed,
                (self.compiled, node.step, node.part()),
                &scope,
                (left, deadline),
                self.lease_lost,
            )
            .await;
        (node, called.map(Some))
    }
}

/// The unconsumed signals the claim found, oldest first; each is taken
/// once in a segment.
struct Pending(VecDeque<SignalEntry>);

impl Pending {
    fn of(row: &RunRow) -> Result<Self, StepFailure> {
        let entries = signals::entries(row).map_err(|e| StepFailure::Defect(e.to_string()))?;
        Ok(Self(
            entries
                .into_iter()
                .filter(SignalEntry::is_pending)
                .collect(),
        ))
    }

    /// The oldest signal called `name`: its number and payload.
    fn take(&mut self, name: &str) -> Option<(i64, Json)> {
        let at = self.0.iter().position(|s| s.name == name)?;
        self.0.remove(at).map(|s| (s.seq, s.payload))
    }
}

/// A call under way, counted in `flotilla_steps_running` until it ends or
/// is dropped (a lost lease drops every call of the segment).
struct Running;

impl Running {
    fn new() -> Self {
        metrics::gauge!("flotilla_steps_running").increment(1.0);
        Self
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        metrics::gauge!("flotilla_steps_running").decrement(1.0);
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
    }
}

/// A JSON value's kind, for error messages.
fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "a map",
    }
}
