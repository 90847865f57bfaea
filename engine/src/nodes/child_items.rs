//! `start` steps with `for_each`: one child per item of the list, at most
//! the workflow's `parallelism` of them running at once, the step's
//! response the children's results in item order.
//!
//! Each item's child is known by `<step>[<index>]` (its id derived from
//! the parent's and that key, so a repeat starts nothing new; its link and
//! its outcome in the parent's row), and is started in one transaction
//! with its item's "child started" checkpoint, as a lone child is
//! (`child.rs`). The parent waits for them holding no lease; each child's
//! end wakes it, and it starts the next items then. A child that did not
//! complete fails the step, as a failed item of a `for_each` does.

use std::collections::HashSet;

use flotilla_workflow::StartChild;
use flotilla_workflow::expr::Scope;
use serde_json::Value as Json;

use super::child::{ChildState, item_key};
use super::{Began, Nodes, Wait, checkpoint};

impl Nodes<'_> {
    /// Starts `start` step `index` over its list: its answer once every
    /// item's child completed, the children to start while there is room,
    /// else a wait. `started`: the items whose child this run started.
    pub(super) async fn begin_children(
        &self,
        index: usize,
        start: &StartChild,
        scope: Scope,
        started: Option<&HashSet<usize>>,
    ) -> Began {
        let name = self.compiled.steps[index].definition.name.clone();
        let list = match self.list(index, &scope).await {
            Ok(None) => return Began::Answer(checkpoint(name, None, None)),
            Ok(Some((list, _))) => list,
            Err(failed) => return Began::Failed(failed),
        };
        let mut results = Vec::with_capacity(list.len());
        let mut running = Vec::new();
        let mut not_started = Vec::new();
        for (item, value) in list.iter().enumerate() {
            let item_scope = scope
                .clone()
                .with("item", value)
                .with("index", &Json::from(item));
            let was_started = started.is_some_and(|started| started.contains(&item));
            let state = self
                .engine
                .child_state_now(self.claimed.row(), &item_key(&name, item), was_started)
                .await;
            match state {
                Ok(ChildState::Completed(result)) => {
                    if let Err(failed) = self.judge(index, &result, &item_scope).await {
                        return Began::Failed(failed);
                    }
                    results.push(Some(result));
                }
                Ok(ChildState::Failed(failed)) | Err(failed) => return Began::Failed(failed),
                Ok(ChildState::Running) => {
                    running.push(item_key(&name, item));
                    results.push(None);
                }
                Ok(ChildState::NotStarted) => {
                    results.push(None);
                    not_started.push((item, item_scope));
                }
            }
        }
        if results.iter().all(Option::is_some) {
            let all = results.into_iter().flatten().collect();
            return Began::Answer(checkpoint(name, None, Some(Json::Array(all))));
        }
        let room = self
            .compiled
            .definition
            .parallelism()
            .saturating_sub(running.len());
        let mut children = Vec::new();
        for (item, item_scope) in not_started.into_iter().take(room) {
            match self.new_child(index, start, &item_scope, Some(item)).await {
                Ok(child) => children.push(child),
                Err(failed) => return Began::Failed(failed),
            }
        }
        if children.is_empty() {
            Began::Waits(Wait::Child(running))
        } else {
            Began::StartChildren(children, running)
        }
    }
}
