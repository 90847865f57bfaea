//! What a step sees (`input` and its ancestors' answers, converted to CEL
//! once per segment), whether it runs (its `when`), and an answer judged
//! as its own: shared by every step kind.

use std::collections::HashMap;

use flotilla_targets::StepFailure;
use flotilla_workflow::expr::{Cel, Scope, to_cel};
use serde_json::{Map, Value as Json};

use super::Nodes;
use super::call::over_budget;
use crate::support::judge::check_response;

/// The segment's input and answers converted to CEL, each once.
#[derive(Default)]
pub(super) struct Converted {
    input: Option<Cel>,
    answers: HashMap<String, Cel>,
}

impl Nodes<'_> {
    /// What step `index` sees: `input` and the answers of its ancestors.
    /// Each answer is converted to CEL once per segment (`converted`, by
    /// step; an answer never changes once given), so a long graph costs
    /// one conversion per answer, not one per answer per later step.
    pub(super) fn scope(
        &self,
        index: usize,
        steps: &Map<String, Json>,
        converted: &mut Converted,
    ) -> Scope {
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

    /// Judges a signal's payload as step `index`'s answer.
    pub(super) async fn judge(
        &self,
        index: usize,
        payload: &Json,
        scope: &Scope,
    ) -> Result<(), StepFailure> {
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
    pub(super) async fn holds(&self, index: usize, scope: &Scope) -> Result<bool, StepFailure> {
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
}
