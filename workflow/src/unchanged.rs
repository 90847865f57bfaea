//! Which steps of a job keep their checkpoints when an operator moves it to
//! another version of its workflow.
//!
//! A step is unchanged when the new version has a step of the same name
//! whose document is equal, field for field, to the old one; whose needs,
//! as resolved (an unset `needs` is the step before it), name the same
//! steps; and whose needs are all unchanged in turn. Its checkpoint holds
//! then: the same request built from the same answers to the same target.
//! Every other step of the old version runs again.

use std::collections::BTreeSet;

use crate::graph::Graph;
use crate::model::WorkflowDefinition;

/// The steps of `old` whose checkpoints do not hold in `new` (changed,
/// removed, or needing one that is), in `old`'s order; `None` when either
/// version's graph does not resolve.
#[must_use]
pub fn steps_to_run_again(
    old: &WorkflowDefinition,
    new: &WorkflowDefinition,
) -> Option<Vec<String>> {
    let (old_graph, new_graph) = (
        Graph::resolve(&old.steps).ok()?,
        Graph::resolve(&new.steps).ok()?,
    );
    let needs_of = |definition: &WorkflowDefinition, graph: &Graph, index: usize| {
        graph
            .needs(index)
            .iter()
            .map(|&need| definition.steps[need].name.clone())
            .collect::<BTreeSet<String>>()
    };
    // Equal and needing the same steps; then, until nothing changes, a
    // step needing one that does not hold does not hold either (needs may
    // name a later step, so one pass in order is not enough).
    let mut kept: BTreeSet<&str> = BTreeSet::new();
    let mut needs: Vec<BTreeSet<String>> = Vec::with_capacity(old.steps.len());
    for (index, step) in old.steps.iter().enumerate() {
        let own = needs_of(old, &old_graph, index);
        let counterpart = new.steps.iter().position(|s| s.name == step.name);
        if counterpart
            .is_some_and(|at| new.steps[at] == *step && own == needs_of(new, &new_graph, at))
        {
            kept.insert(step.name.as_str());
        }
        needs.push(own);
    }
    loop {
        let broken: Vec<&str> = old
            .steps
            .iter()
            .zip(&needs)
            .filter(|(step, needs)| {
                kept.contains(step.name.as_str())
                    && needs.iter().any(|need| !kept.contains(need.as_str()))
            })
            .map(|(step, _)| step.name.as_str())
            .collect();
        if broken.is_empty() {
            break;
        }
        for name in broken {
            kept.remove(name);
        }
    }
    let again = old
        .steps
        .iter()
        .filter(|step| !kept.contains(step.name.as_str()))
        .map(|step| step.name.clone())
        .collect();
    Some(again)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workflow(steps: serde_json::Value) -> WorkflowDefinition {
        serde_json::from_value(serde_json::json!({"name": "w", "input_schema": {}, "steps": steps}))
            .unwrap()
    }

    fn call(name: &str, method: &str) -> serde_json::Value {
        serde_json::json!({"name": name, "target": "t", "method": method})
    }

    #[test]
    fn a_changed_step_runs_again_with_every_step_after_it_that_needs_it() {
        let old = workflow(serde_json::json!([
            call("a", "m"),
            call("b", "m"),
            call("c", "m")
        ]));
        let same = old.clone();
        assert_eq!(
            steps_to_run_again(&old, &same).unwrap(),
            Vec::<String>::new()
        );
        let b_changed = workflow(serde_json::json!([
            call("a", "m"),
            call("b", "other"),
            call("c", "m")
        ]));
        assert_eq!(steps_to_run_again(&old, &b_changed).unwrap(), ["b", "c"]);
    }

    #[test]
    fn a_step_inserted_before_one_with_implicit_needs_changes_what_it_needs() {
        let old = workflow(serde_json::json!([call("a", "m"), call("c", "m")]));
        let inserted = workflow(serde_json::json!([
            call("a", "m"),
            call("b", "m"),
            call("c", "m")
        ]));
        assert_eq!(steps_to_run_again(&old, &inserted).unwrap(), ["c"]);
    }

    #[test]
    fn a_branch_that_did_not_change_keeps_its_checkpoints_and_a_removed_step_runs_no_more() {
        let step = |name: &str, method: &str, needs: &[&str]| {
            let mut step = call(name, method);
            step["needs"] = serde_json::json!(needs);
            step
        };
        let old = workflow(serde_json::json!([
            step("a", "m", &[]),
            step("left", "m", &["a"]),
            step("right", "m", &["a"]),
            step("gone", "m", &["a"])
        ]));
        let new = workflow(serde_json::json!([
            step("a", "m", &[]),
            step("left", "m", &["a"]),
            step("right", "changed", &["a"])
        ]));
        assert_eq!(steps_to_run_again(&old, &new).unwrap(), ["right", "gone"]);
    }
}
