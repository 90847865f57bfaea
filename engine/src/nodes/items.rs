//! The items of `for_each` steps under way in one segment.
//!
//! A `for_each` step calls its target once per item of its list. Each
//! item's answer is a checkpoint of its own (`Checkpoint::item`), so a
//! resumed segment calls only the items without one; once every item has
//! its checkpoint, the step's own checkpoint (the answers in item order)
//! ends the step. Answers are kept by index, so the first item checkpoint
//! holds the list's digest too, which every later segment's list must
//! match (`nodes/mod.rs`).

use std::collections::{BTreeMap, VecDeque};

use serde_json::Value as Json;

use flotilla_workflow::expr::Scope;
use std::collections::HashMap;

use flotilla_targets::StepFailure;

use super::call::over_budget;
use super::{Began, Nodes, checkpoint};
use crate::support::digest::list_digest;

/// One `for_each` step's items.
#[derive(Debug)]
struct Step {
    /// The step's scope, without `item` and `index`.
    scope: Scope,
    list: Vec<Json>,
    /// The list's digest, until the first item answered takes it.
    digest: Option<String>,
    answers: Vec<Option<Json>>,
    /// Items without an answer, not yet called.
    to_call: VecDeque<usize>,
}

/// Every `for_each` step under way, by step index.
#[derive(Debug, Default)]
pub(crate) struct Items(BTreeMap<usize, Step>);

impl Items {
    /// Starts step `step` over `list`, with the answers checkpointed
    /// before (`answered`: index → answer) and the list's digest when the
    /// first item checkpoint is to hold it. Gives the answers in order
    /// when every item has one already.
    pub(crate) fn start(
        &mut self,
        step: usize,
        scope: Scope,
        (list, digest): (Vec<Json>, Option<String>),
        answered: Option<BTreeMap<u32, Json>>,
    ) -> Option<Json> {
        let mut answers = vec![None; list.len()];
        for (index, answer) in answered.into_iter().flatten() {
            if let Some(slot) = answers.get_mut(index as usize) {
                *slot = Some(answer);
            }
        }
        let to_call = (0..list.len()).filter(|&i| answers[i].is_none()).collect();
        self.0.insert(
            step,
            Step {
                scope,
                list,
                digest,
                answers,
                to_call,
            },
        );
        self.all_answered(step)
    }

    /// The next item to call, first of the earliest step: (step, index,
    /// the item's scope).
    pub(crate) fn next_call(&mut self) -> Option<(usize, usize, Scope)> {
        self.0.iter_mut().find_map(|(&step, items)| {
            let index = items.to_call.pop_front()?;
            let scope = items
                .scope
                .clone()
                .with("item", &items.list[index])
                .with("index", &Json::from(index));
            Some((step, index, scope))
        })
    }

    /// The list digest for the checkpoint of `step`'s first item answered
    /// (`None` for every later one).
    pub(crate) fn take_list_digest(&mut self, step: usize) -> Option<String> {
        self.0.get_mut(&step)?.digest.take()
    }

    /// Item `index` of `step` has its checkpoint; gives the answers in
    /// order when it was the last.
    pub(crate) fn answered(&mut self, step: usize, index: usize, answer: Json) -> Option<Json> {
        let items = self.0.get_mut(&step)?;
        *items.answers.get_mut(index)? = Some(answer);
        self.all_answered(step)
    }

    fn all_answered(&mut self, step: usize) -> Option<Json> {
        let items = self.0.get(&step)?;
        if items.answers.iter().any(Option::is_none) {
            return None;
        }
        let items = self.0.remove(&step)?;
        Some(Json::Array(items.answers.into_iter().flatten().collect()))
    }
}

/// What the segment's replay found of `for_each` steps not yet ended:
/// their items' answers (step → item → answer) and the digests of the
/// lists those answered.
type Earlier<'e> = (
    &'e mut HashMap<usize, BTreeMap<u32, Json>>,
    &'e mut HashMap<usize, String>,
);

impl Nodes<'_> {
    /// Starts `for_each` step `index`: its list, the answers its items
    /// were given before (`earlier`: answers and the digest of the list
    /// they answered), and the items still to call, handed out by the
    /// segment's loop.
    pub(super) async fn begin_items(
        &self,
        index: usize,
        scope: Scope,
        items: &mut Items,
        (earlier_items, earlier_lists): Earlier<'_>,
    ) -> Began {
        let name = self.compiled.steps[index].definition.name.clone();
        let (list, digest) = match self.list(index, &scope).await {
            Ok(None) => return Began::Answer(checkpoint(name, None, None)),
            Ok(Some(listed)) => listed,
            Err(failed) => return Began::Failed(failed),
        };
        let before = earlier_items.remove(&index);
        // Answers are kept by index: a list other than the one they
        // answered would give them to other items.
        let to_store = match earlier_lists.remove(&index) {
            Some(stored) if stored != digest => {
                return Began::Failed(StepFailure::Defect(format!(
                    "step {name}: for_each gave a different list from the one \
                     its answered items were called over (a for_each list must \
                     be the same on every segment)"
                )));
            }
            // Stored with the first item, in a run that only releases
            // reading digests claim.
            None if before.is_none()
                && self.claimed.row().reader_level
                    >= flotilla_store::runs::FOR_EACH_READER_LEVEL =>
            {
                Some(digest)
            }
            _ => None,
        };
        match items.start(index, scope, (list, to_store), before) {
            Some(all) => Began::Answer(checkpoint(name, None, Some(all))),
            None => Began::Items,
        }
    }

    /// The items of `for_each` step `index` and their digest, or `None`
    /// when its `when` skips it. More items than the step allows is the
    /// job's verdict.
    pub(super) async fn list(
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn items_are_called_in_order_and_the_step_ends_with_every_answer_in_item_order() {
        let mut items = Items::default();
        let list = vec![json!("a"), json!("b"), json!("c")];
        assert_eq!(items.start(4, Scope::default(), (list, None), None), None);
        let calls: Vec<(usize, usize)> = std::iter::from_fn(|| items.next_call())
            .map(|(step, index, _)| (step, index))
            .collect();
        assert_eq!(calls, [(4, 0), (4, 1), (4, 2)]);
        assert_eq!(items.answered(4, 2, json!(2)), None);
        assert_eq!(items.answered(4, 0, json!(0)), None);
        assert_eq!(items.answered(4, 1, json!(1)), Some(json!([0, 1, 2])));
    }

    #[test]
    fn the_first_item_answered_takes_the_list_digest_and_no_other() {
        let mut items = Items::default();
        let list = (vec![json!("a"), json!("b")], Some("digest".to_owned()));
        assert_eq!(items.start(0, Scope::default(), list, None), None);
        assert_eq!(items.take_list_digest(0).as_deref(), Some("digest"));
        assert_eq!(items.take_list_digest(0), None);
        assert_eq!(items.take_list_digest(1), None);
    }

    #[test]
    fn a_resumed_step_calls_only_the_items_without_an_answer() {
        let mut items = Items::default();
        let list = vec![json!(10), json!(11), json!(12)];
        let before = BTreeMap::from([(0, json!("x")), (2, json!("z"))]);
        assert_eq!(
            items.start(0, Scope::default(), (list, None), Some(before)),
            None
        );
        let (_, index, _) = items.next_call().unwrap();
        assert_eq!(index, 1);
        assert!(items.next_call().is_none());
        assert_eq!(
            items.answered(0, 1, json!("y")),
            Some(json!(["x", "y", "z"]))
        );
    }

    #[test]
    fn an_empty_list_or_one_fully_answered_ends_at_once() {
        let mut items = Items::default();
        assert_eq!(
            items.start(0, Scope::default(), (vec![], None), None),
            Some(json!([]))
        );
        let done = BTreeMap::from([(0, json!(1))]);
        assert_eq!(
            items.start(1, Scope::default(), (vec![json!(0)], None), Some(done)),
            Some(json!([1]))
        );
        assert!(items.next_call().is_none());
    }
}
