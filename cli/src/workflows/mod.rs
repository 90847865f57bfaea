//! `flotilla workflows`: definitions offline (`validate`, `schema`: no
//! worker, database or broker), rehearsed against recorded answers
//! (`test`: a database only), and through the API (`put`, `get`, `list`,
//! `versions`, `diff`).

mod offline;
mod rehearse;

use std::path::PathBuf;

use clap::Subcommand;
use flotilla_workflow::schema;
use reqwest::Method;
use secrecy::SecretString;
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
    /// Run a definition through the engine against recorded answers, on a
    /// virtual clock (timers and backoff take no time), and print the path
    /// it takes: each call and its answer, each checkpoint, skip, retry and
    /// wait, and the outcome. Needs only a Postgres, in which a scratch
    /// database is created and dropped. Exits 0 when the outcome is the
    /// one the fixtures expect, 1 when it is not, 2 when a file is wrong.
    Test {
        /// The workflow's definition, then those of the children it starts.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The fixtures: the input, the answers per step, the signals and
        /// the expected outcome (YAML or JSON; see docs/workflows.md).
        #[arg(long)]
        responses: PathBuf,
        /// Postgres to create the scratch database in (a secret: never
        /// printed); its role needs CREATEDB.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_parser = crate::client::secret)]
        database_url: SecretString,
    },
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
        WorkflowsCommand::Validate { files, targets } => {
            offline::validate(&files, targets.as_deref())
        }
        WorkflowsCommand::Test {
            files,
            responses,
            database_url,
        } => rehearse::test(&files, &responses, &database_url).await,
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
