//! Judging an answer as a step's: its output schema, then its `validate`
//! rules. Shared by the call executor (`nodes/call.rs`) and by the answers
//! callers bring (`ops/complete_step.rs`, signals taken by `wait_for`).

use flotilla_targets::StepFailure;
use flotilla_workflow::expr::Scope;
use flotilla_workflow::{CompiledStep, schema_violations};
use serde_json::Value as Json;

/// A response must fit the step's output schema (else the target broke its
/// contract: a defect) and pass every `validate` rule (else a verdict).
pub(crate) fn check_response(
    step: &CompiledStep,
    response: &Json,
    scope: &Scope,
) -> Result<(), StepFailure> {
    let name = &step.definition.name;
    if let Some(schema) = &step.output_schema {
        schema_violations(schema, response).map_err(|violations| {
            StepFailure::Defect(format!(
                "step {name}: the response does not fit the output schema: {}",
                violations.join("; ")
            ))
        })?;
    }
    let scope = scope.clone().with("response", response);
    let mut violations = Vec::new();
    for rule in &step.validate {
        match rule.evaluate_bool(&scope) {
            Ok(true) => {}
            Ok(false) => violations.push(format!("{name}: {}", rule.source())),
            Err(e) => {
                return Err(StepFailure::Defect(format!(
                    "step {name}: validate rule {e}"
                )));
            }
        }
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(StepFailure::Verdict {
            message: format!("step {name} failed validation: {}", violations.join("; ")),
            violations,
        })
    }
}
