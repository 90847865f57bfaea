//! The offline checks: `validate` holds definition files to what a
//! worker's registration would say of them, with no service running.

use std::path::{Path, PathBuf};

use flotilla_workflow::{CompiledWorkflow, DefinitionProblem, schema};
use serde_json::Value;

use crate::Failure;

/// Checks each file; prints every problem, or `ok`.
pub(crate) fn validate(files: &[PathBuf], targets: Option<&Path>) -> Result<(), Failure> {
    let known = match targets {
        Some(path) => Some(
            flotilla_targets::file::names(path)
                .map_err(|e| Failure::usage(anyhow::anyhow!("{e}")))?,
        ),
        None => None,
    };
    let mut failed = 0usize;
    for file in files {
        let shown = file.display();
        let problems = match std::fs::read_to_string(file) {
            Err(e) => vec![format!("cannot be read: {e}")],
            Ok(text) => match flotilla_workflow::read_document(&text) {
                Err(e) => vec![format!("is neither JSON nor YAML: {e}")],
                Ok(document) => problems_of(&document, known.as_ref()),
            },
        };
        if problems.is_empty() {
            println!("{shown}: ok");
        } else {
            failed += 1;
            for problem in &problems {
                println!("{shown}: {problem}");
            }
            println!("{shown}: {} problem(s)", problems.len());
        }
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(Failure::usage(anyhow::anyhow!(
            "{failed} of {} definition(s) have problems",
            files.len()
        )))
    }
}

/// What the worker's registration would say of `document`, each problem
/// as `steps[2] (charge): needs: …`.
fn problems_of(
    document: &Value,
    targets: Option<&std::collections::HashSet<String>>,
) -> Vec<String> {
    // Without a targets file every target a step names is accepted.
    let known = targets.cloned().unwrap_or_else(|| {
        ["steps", "on_failure"]
            .iter()
            .flat_map(|list| document[list].as_array().into_iter().flatten())
            .filter_map(|step| step["target"].as_str().map(str::to_owned))
            .collect()
    });
    // The CEL parser recurses deeply: compile on a thread with the stack a
    // worker's evaluation threads have.
    let owned = document.clone();
    let compiled = std::thread::Builder::new()
        .stack_size(64 * 1024 * 1024)
        .spawn(move || CompiledWorkflow::compile(&owned, &known).map(|_| ()))
        .ok()
        .and_then(|thread| thread.join().ok());
    let positions = schema::step_positions(document);
    match compiled {
        Some(Ok(())) => Vec::new(),
        Some(Err(invalid)) => invalid
            .problems
            .iter()
            .map(|problem| located(problem, &positions))
            .collect(),
        None => vec!["checking it crashed (a definition too deep to parse)".to_owned()],
    }
}

fn located(problem: &DefinitionProblem, positions: &serde_json::Map<String, Value>) -> String {
    match &problem.step {
        Some(step) => match positions.get(step).and_then(Value::as_str) {
            Some(at) => format!("{at} ({step}): {}: {}", problem.field, problem.message),
            None => format!("{step}: {}: {}", problem.field, problem.message),
        },
        None => format!("{}: {}", problem.field, problem.message),
    }
}
