//! What a job's graph looks like now: every step with its state, its
//! edges both ways, the items a `for_each` has answered, the last cursor
//! of a paged step and the instant a timer wakes at.
//!
//! Read from the row alone (its definition, checkpoints, status, waiting
//! step and timers), without compiling the definition, so any fleet member
//! can draw any job, whatever targets it has.

use std::collections::HashMap;

use flotilla_store::RunStatus;
use flotilla_store::runs::RunRow;
use serde::Serialize;
use serde_json::Value as Json;

use flotilla_workflow::{Graph, WorkflowDefinition};

/// A step's state in a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// A step it needs has not ended.
    Pending,
    /// Its needs ended and the job is running (or queued to run) it.
    Ready,
    Completed,
    Skipped,
    /// The job is parked on it for an answer.
    Waiting,
    /// A timer that has not woken.
    Sleeping,
    /// The job ended FAILED or DEAD (or was cancelled) before this ready
    /// step ended.
    Stopped,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct NodeView {
    pub name: String,
    pub state: NodeState,
    /// `call`, `external`, `timer`, `signal`, `for_each`, `paged` or
    /// `repeat`.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// For a step that names its verb or path: the last call made, as
    /// made (`GET /orders/42`), or before one, as its definition writes
    /// it (`GET /orders/{input.order_id}`). Never its headers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    pub needs: Vec<String>,
    pub dependants: Vec<String>,
    /// Items of a `for_each` answered so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items_done: Option<usize>,
    /// Pages of a paged step stored so far, and the last cursor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pages: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<Json>,
    /// Calls of a repeating step so far whose answer was not yet the one
    /// it waits for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub polls: Option<u32>,
    /// The instant a timer wakes at, once reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wakes_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct GraphView {
    pub job_id: uuid::Uuid,
    pub status: String,
    pub nodes: Vec<NodeView>,
}

/// The graph of `row`, or why it cannot be drawn.
///
/// # Errors
/// The row's definition does not parse or its needs do not resolve (a row
/// another version wrote).
pub fn of(row: &RunRow) -> Result<GraphView, String> {
    let definition: WorkflowDefinition = serde_json::from_value(row.definition.0.clone())
        .map_err(|e| format!("the job's definition does not parse: {e}"))?;
    let graph = Graph::resolve(&definition.steps).map_err(|problems| {
        let first = problems
            .first()
            .map_or(String::new(), |p| p.message.clone());
        format!("the job's definition does not resolve: {first}")
    })?;
    let index: HashMap<&str, usize> = definition
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| (step.name.as_str(), i))
        .collect();
    let n = definition.steps.len();
    let mut ended: Vec<Option<NodeState>> = vec![None; n];
    let mut items = vec![0usize; n];
    let mut pages: Vec<Option<(u32, Json)>> = vec![None; n];
    let mut calls: Vec<Option<String>> = vec![None; n];
    let mut polls: Vec<Option<u32>> = vec![None; n];
    for checkpoint in row.checkpoints.0.as_array().into_iter().flatten() {
        let Some(&i) = checkpoint["name"].as_str().and_then(|name| index.get(name)) else {
            continue;
        };
        if let Some(call) = checkpoint["call"].as_str() {
            calls[i] = Some(call.to_owned());
        }
        let child_started = checkpoint.get("child").is_some_and(|c| !c.is_null());
        if child_started {
            // A child under way (one of a `start` per item, too): not an
            // answer yet.
        } else if checkpoint.get("item").is_some_and(|item| !item.is_null()) {
            items[i] += 1;
        } else if let Some(poll) = checkpoint.get("poll").and_then(Json::as_u64) {
            polls[i] = Some(u32::try_from(poll + 1).unwrap_or(u32::MAX));
        } else if let Some(page) = checkpoint.get("page").and_then(Json::as_u64) {
            let cursor = checkpoint["response"]["cursor"].clone();
            pages[i] = Some((u32::try_from(page + 1).unwrap_or(u32::MAX), cursor));
        } else if checkpoint["skipped"] == Json::Bool(true) {
            ended[i] = Some(NodeState::Skipped);
        } else {
            ended[i] = Some(NodeState::Completed);
        }
    }
    let timers = row.timers.as_ref().map(|t| &t.0);
    let stopped = matches!(
        row.status,
        RunStatus::Failed | RunStatus::Dead | RunStatus::Cancelled
    );
    let names = |of: &[usize]| -> Vec<String> {
        of.iter()
            .map(|&j| definition.steps[j].name.clone())
            .collect()
    };
    let nodes = definition
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let wakes_at = timers
                .and_then(|t| t.get(&step.name))
                .and_then(Json::as_str)
                .map(str::to_owned);
            let state = ended[i].unwrap_or_else(|| {
                let needs_ended = graph.needs(i).iter().all(|&j| ended[j].is_some());
                if !needs_ended {
                    NodeState::Pending
                } else if row.status == RunStatus::Waiting
                    && row.outstanding_step.as_deref() == Some(step.name.as_str())
                {
                    NodeState::Waiting
                } else if stopped {
                    NodeState::Stopped
                } else if wakes_at.is_some() {
                    NodeState::Sleeping
                } else {
                    NodeState::Ready
                }
            });
            let kind = if step.is_timer() {
                "timer"
            } else if step.wait_for.is_some() {
                "signal"
            } else if step.is_external() {
                "external"
            } else if step.for_each.is_some() {
                "for_each"
            } else if step.paged {
                "paged"
            } else if step.repeat.is_some() {
                "repeat"
            } else {
                "call"
            };
            NodeView {
                name: step.name.clone(),
                state,
                kind,
                target: Some(step.target.clone()).filter(|t| !t.is_empty()),
                call: calls[i].take().or_else(|| as_written(step)),
                needs: names(graph.needs(i)),
                dependants: names(graph.dependants(i)),
                items_done: step.for_each.is_some().then_some(items[i]),
                pages: pages[i].as_ref().map(|(count, _)| *count),
                cursor: pages[i].as_ref().map(|(_, cursor)| cursor.clone()),
                polls: polls[i],
                wakes_at,
            }
        })
        .collect();
    Ok(GraphView {
        job_id: row.job_id,
        status: row.status.as_str().to_owned(),
        nodes,
    })
}

/// A shaped step's call as its definition writes it: its verb (the
/// target's own when it names none) and its path template.
fn as_written(step: &flotilla_workflow::StepDefinition) -> Option<String> {
    if step.verb.is_none() && step.path.is_none() {
        return None;
    }
    let verb = step
        .verb
        .map_or("(target's verb)", flotilla_workflow::Verb::as_str);
    let path = step
        .path
        .clone()
        .unwrap_or_else(|| format!("/{}", step.method));
    Some(format!("{verb} {path}"))
}

/// Whether `step` of the job's own definition is ready now: every step it
/// needs has ended (one without `needs` needs the step before it, the
/// graph's rule), read from the row alone, and it has not ended itself.
pub(crate) fn is_ready_now(row: &RunRow, step: &str) -> bool {
    let steps: &[Json] = row.definition.0["steps"]
        .as_array()
        .map_or(&[], Vec::as_slice);
    let ended_steps = row.ended_steps();
    let ended = |wanted: &str| ended_steps.contains(wanted);
    let Some(at) = steps.iter().position(|s| s["name"].as_str() == Some(step)) else {
        return false;
    };
    if ended(step) {
        return false;
    }
    match steps[at]["needs"].as_array() {
        Some(needs) => needs.iter().filter_map(Json::as_str).all(ended),
        None => at == 0 || steps[at - 1]["name"].as_str().is_some_and(ended),
    }
}
