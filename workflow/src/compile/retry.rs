//! Retry policies: each written policy checked, and each step given its
//! own with the workflow's filling the gaps.

use super::Problems;
use crate::compiled::CompiledStep;
use crate::model::WorkflowDefinition;
use crate::retry::{StepRetry, policy_problems};

impl Problems {
    pub(super) fn retry_policies(
        &mut self,
        definition: &WorkflowDefinition,
        steps: &mut [CompiledStep],
        on_failure: &mut [CompiledStep],
    ) {
        if let Some(policy) = &definition.retry {
            for (field, message) in policy_problems(policy, crate::model::MAX_ATTEMPTS) {
                self.add(None, field, message);
            }
        }
        for step in steps.iter_mut().chain(on_failure.iter_mut()) {
            let own = step.definition.retry.as_ref();
            if let Some(policy) = own {
                for (field, message) in policy_problems(policy, crate::model::MAX_ATTEMPTS) {
                    self.add(Some(&step.definition.name), field, message);
                }
            }
            step.retry =
                StepRetry::resolve(own, definition.retry.as_ref(), definition.max_attempts);
        }
    }
}
