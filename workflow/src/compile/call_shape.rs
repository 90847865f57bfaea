//! A step's HTTP call shape (`verb`, `path`, `query`, `headers`): only a
//! call to a target has one; its templates are compiled by `http.rs`.

use super::Problems;
use crate::http::CallShape;
use crate::model::StepDefinition;

impl Problems {
    pub(super) fn call_shape(
        &mut self,
        at: Option<&str>,
        step: &StepDefinition,
    ) -> Option<CallShape> {
        if !step.shapes_its_call() {
            return None;
        }
        if step.is_timer() || step.wait_for.is_some() || step.start.is_some() || step.is_external()
        {
            let field = if step.path.is_some() { "path" } else { "verb" };
            self.add(
                at,
                field,
                "only a call to a target has a verb, path, query or headers",
            );
            return None;
        }
        match CallShape::compile(step) {
            Ok(shape) => shape,
            Err(problems) => {
                for (field, message) in problems {
                    self.add(at, &field, message);
                }
                None
            }
        }
    }
}
