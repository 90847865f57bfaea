//! Paged steps (`paged: true`): the target answers a page at a time, each
//! with `more` and a `cursor`. Each page's cursor is a checkpoint of its
//! own, so a resumed segment fetches from the page after the last cursor
//! stored; the step ends with the page that says no more.

use std::collections::HashMap;

use flotilla_store::runs::Checkpoint;
use flotilla_targets::StepFailure;
use flotilla_workflow::expr::Scope;
use serde_json::Value as Json;

use super::{Began, Node, Nodes, checkpoint};

/// The first call of paged step `node` in this segment: from its first
/// page, or the one after the last cursor stored (`earlier`).
pub(super) fn begin_pages(
    node: Node,
    scope: Scope,
    earlier: &mut HashMap<usize, (u32, Json)>,
) -> Began {
    let (page, cursor) = earlier.remove(&node.step).unwrap_or((0, Json::Null));
    let node = Node {
        page: Some(page),
        ..node
    };
    Began::Call(node, scope.with("cursor", &cursor))
}

impl Nodes<'_> {
    /// Page `page` of `node`'s step said `more: true`: the checkpoint that
    /// keeps its cursor, or why no page follows (past `max_pages`, or no
    /// cursor).
    pub(super) fn next_page(
        &self,
        node: Node,
        page: u32,
        answer: &Json,
    ) -> Result<Checkpoint, StepFailure> {
        let definition = &self.compiled.steps[node.step].definition;
        let (name, most) = (&definition.name, definition.max_pages());
        match answer.get("cursor") {
            Some(_) if page.saturating_add(1) >= most => Err(StepFailure::Verdict {
                message: format!(
                    "step {name}: page {page} says more: true, but the step fetches at most {most} pages (max_pages)"
                ),
                violations: vec![format!("max_pages: {most}")],
            }),
            Some(cursor) => {
                let mut kept = checkpoint(
                    name.clone(),
                    None,
                    Some(serde_json::json!({ "cursor": cursor })),
                );
                kept.page = Some(page);
                Ok(kept)
            }
            None => Err(StepFailure::Defect(format!(
                "step {name}: page {page} says more: true without a cursor"
            ))),
        }
    }
}
