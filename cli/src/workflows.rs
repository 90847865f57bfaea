//! `flotilla workflows`: definitions offline (`validate`, `schema`: no
//! worker, database or broker) and through the API (`put`, `get`, `list`,
//! `versions`, `diff`).

use std::path::{Path, PathBuf};

use clap::Subcommand;
use flotilla_workflow::{CompiledWorkflow, DefinitionProblem, schema};
use reqwest::Method;
use serde_json::Value;

use crate::Failure;
use crate::client::ApiArgs;
use crate::jobs::show;

#[derive(Debug, Subcommand)]
pub(crate) enum WorkflowsCommand {
    /// Check definition files (JSON or YAML) offline, with the checks a
    /// worker makes at registration: every problem at once, each naming
    /// its step and field. Exits 0 when every file is sound, 2 otherwise.
    Validate {
        /// The definition files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The targets file of the fleet: a step naming a target not in it
        /// is a problem. Without it any target name is accepted.
        #[arg(long)]
        targets: Option<PathBuf>,
    },
    /// Print the JSON Schema of a definition (for an editor).
    Schema,
    /// Register a definition (JSON or YAML text, or @file) as the newest
    /// version of its name.
    Put { definition: String },
    /// Show the newest version of a workflow.
    Get { name: String },
    /// List the newest version of every workflow.
    List,
    /// List the stored versions of a workflow, newest first.
    Versions { name: String },
    /// Show what changed between two stored versions of a workflow.
    Diff { name: String, from: i32, to: i32 },
}

pub(crate) async fn run(api: &ApiArgs, command: WorkflowsCommand) -> Result<(), Failure> {
    match command {
        WorkflowsCommand::Validate { files, targets } => validate(&files, targets.as_deref()),
        WorkflowsCommand::Schema => {
            let schema = serde_json::to_string_pretty(&schema::definition_schema())
                .map_err(Failure::usage)?;
            println!("{schema}");
            Ok(())
        }
        WorkflowsCommand::Put { definition } => put(api, &definition).await,
        WorkflowsCommand::Get { name } => {
            let stored = api
                .call(Method::GET, &format!("/v1/workflows/{name}"), None)
                .await?;
            show(api, &stored, |s| println!("{}", pretty(&s["definition"])));
            Ok(())
        }
        WorkflowsCommand::List => {
            let all = api.call(Method::GET, "/v1/workflows", None).await?;
            show(api, &all, |all| {
                println!("{:<30}  {:>7}  CREATED", "NAME", "VERSION");
                for w in all["workflows"].as_array().into_iter().flatten() {
                    println!(
                        "{:<30}  {:>7}  {}",
                        w["name"].as_str().unwrap_or(""),
                        w["version"],
                        w["created_at"].as_str().unwrap_or("")
                    );
                }
            });
            Ok(())
        }
        WorkflowsCommand::Versions { name } => versions(api, &name).await,
        WorkflowsCommand::Diff { name, from, to } => diff(api, &name, from, to).await,
    }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// A definition from its text or `@file`: JSON or YAML.
fn definition_arg(raw: &str) -> Result<Value, Failure> {
    let text = match raw.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Failure::usage(anyhow::anyhow!("reading {path}: {e}")))?,
        None => raw.to_owned(),
    };
    flotilla_workflow::read_document(&text).map_err(|e| {
        Failure::usage(anyhow::anyhow!(
            "the definition is neither JSON nor YAML: {e}"
        ))
    })
}

async fn put(api: &ApiArgs, definition: &str) -> Result<(), Failure> {
    let document = definition_arg(definition)?;
    let name = document["name"]
        .as_str()
        .ok_or_else(|| Failure::usage(anyhow::anyhow!("the definition has no name")))?
        .to_owned();
    let stored = api
        .call(
            Method::PUT,
            &format!("/v1/workflows/{name}"),
            Some(&document),
        )
        .await?;
    show(api, &stored, |s| {
        println!(
            "{} version {}",
            s["name"].as_str().unwrap_or(""),
            s["version"]
        );
    });
    Ok(())
}

/// Checks each file; prints every problem, or `ok`.
fn validate(files: &[PathBuf], targets: Option<&Path>) -> Result<(), Failure> {
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

async fn versions(api: &ApiArgs, name: &str) -> Result<(), Failure> {
    let mut all = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let path = match before {
            Some(before) => format!("/v1/workflows/{name}/versions?before={before}"),
            None => format!("/v1/workflows/{name}/versions"),
        };
        let page = api.call(Method::GET, &path, None).await?;
        all.extend(page["versions"].as_array().into_iter().flatten().cloned());
        match page["next_before"].as_i64() {
            Some(next) => before = Some(next),
            None => break,
        }
    }
    let all = Value::Array(all);
    show(api, &all, |all| {
        println!("{:>7}  CREATED", "VERSION");
        for v in all.as_array().into_iter().flatten() {
            println!(
                "{:>7}  {}",
                v["version"],
                v["created_at"].as_str().unwrap_or("")
            );
        }
    });
    Ok(())
}

/// Version `version` of `name`'s definition.
async fn version_of(api: &ApiArgs, name: &str, version: i32) -> Result<Value, Failure> {
    let path = format!(
        "/v1/workflows/{name}/versions?before={}&limit=1",
        i64::from(version) + 1
    );
    let page = api.call(Method::GET, &path, None).await?;
    page["versions"]
        .as_array()
        .and_then(|versions| versions.first())
        .filter(|stored| stored["version"].as_i64() == Some(i64::from(version)))
        .map(|stored| stored["definition"].clone())
        .ok_or_else(|| Failure::not_found(anyhow::anyhow!("{name} has no version {version}")))
}

async fn diff(api: &ApiArgs, name: &str, from: i32, to: i32) -> Result<(), Failure> {
    let (old, new) = (
        pretty(&version_of(api, name, from).await?),
        pretty(&version_of(api, name, to).await?),
    );
    let diff = similar::TextDiff::from_lines(&old, &new);
    print!(
        "{}",
        diff.unified_diff().context_radius(3).header(
            &format!("{name} version {from}"),
            &format!("{name} version {to}")
        )
    );
    Ok(())
}
