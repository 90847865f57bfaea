//! The API verbs on jobs: submit, get, list, complete, retry, cancel.

use clap::Args;
use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::Failure;
use crate::client::ApiArgs;

/// JSON text, or @path to read it from a file.
pub(crate) fn json_arg(raw: &str, what: &str) -> Result<Value, Failure> {
    let text = match raw.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Failure::usage(anyhow::anyhow!("reading {path}: {e}")))?,
        None => raw.to_owned(),
    };
    serde_json::from_str(&text)
        .map_err(|e| Failure::usage(anyhow::anyhow!("{what} is not JSON: {e}")))
}

#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    /// A stored workflow to run.
    #[arg(
        long,
        conflicts_with = "workflow_file",
        required_unless_present = "workflow_file"
    )]
    workflow: Option<String>,
    /// The stored version to run (from 1); without it, the newest.
    #[arg(long, requires = "workflow")]
    workflow_version: Option<i32>,
    /// 0 (the default) to 10: a head start in the queue, a minute per point.
    #[arg(long)]
    priority: Option<i32>,
    /// An inline workflow definition (@file or JSON).
    #[arg(long = "definition")]
    workflow_file: Option<String>,
    /// The input document (JSON or @file).
    #[arg(long, default_value = "{}")]
    input: String,
    /// The job id (idempotency key).
    #[arg(long)]
    job_id: Option<Uuid>,
    /// A label on the job, `key=value`; give it again for more.
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    metadata: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[arg(long)]
    status: Option<String>,
    #[arg(long)]
    workflow: Option<String>,
    #[arg(long, default_value_t = 0)]
    limit: i64,
    #[arg(long)]
    cursor: Option<String>,
    /// Only jobs labelled `key=value`; give it again for more.
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    metadata: Vec<String>,
}

/// `--metadata key=value` flags as a JSON object; `None` for none.
pub(crate) fn metadata_arg(pairs: &[String]) -> Result<Option<Value>, Failure> {
    if pairs.is_empty() {
        return Ok(None);
    }
    let mut entries = serde_json::Map::new();
    for pair in pairs {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            Failure::usage(anyhow::anyhow!("--metadata {pair:?} is not key=value"))
        })?;
        entries.insert(key.to_owned(), Value::String(value.to_owned()));
    }
    Ok(Some(Value::Object(entries)))
}

fn print_jobs(jobs: &[Value]) {
    println!(
        "{:<36}  {:<10}  {:<20}  {:>7}  {:<24}  VERDICT / ERROR",
        "JOB", "STATUS", "WORKFLOW", "ATTEMPT", "UPDATED"
    );
    for job in jobs {
        let note = job["verdict"]
            .as_str()
            .or_else(|| job["error"].as_str())
            .unwrap_or("");
        println!(
            "{:<36}  {:<10}  {:<20}  {:>3}/{:<3}  {:<24}  {note}",
            job["job_id"].as_str().unwrap_or(""),
            job["status"].as_str().unwrap_or(""),
            job["workflow_name"].as_str().unwrap_or(""),
            job["attempt"],
            job["max_attempts"],
            job["updated_at"].as_str().unwrap_or(""),
        );
    }
}

pub(crate) fn show(api: &ApiArgs, value: &Value, table: impl FnOnce(&Value)) {
    if api.json {
        println!("{value}");
    } else {
        table(value);
    }
}

pub(crate) async fn submit(api: &ApiArgs, args: SubmitArgs) -> Result<(), Failure> {
    let mut body = json!({ "input": json_arg(&args.input, "--input")? });
    match (args.workflow, args.workflow_file) {
        (Some(name), _) => {
            body["workflow_name"] = json!(name);
            if let Some(version) = args.workflow_version {
                body["workflow_version"] = json!(version);
            }
        }
        (None, Some(raw)) => body["workflow"] = json_arg(&raw, "--definition")?,
        (None, None) => {
            return Err(Failure::usage(anyhow::anyhow!(
                "give --workflow or --definition"
            )));
        }
    }
    if let Some(id) = args.job_id {
        body["job_id"] = json!(id);
    }
    if let Some(priority) = args.priority {
        body["priority"] = json!(priority);
    }
    if let Some(metadata) = metadata_arg(&args.metadata)? {
        body["metadata"] = metadata;
    }
    let job = api.call(Method::POST, "/v1/jobs", Some(&body)).await?;
    show(api, &job, |job| {
        println!("{}", job["job_id"].as_str().unwrap_or(""))
    });
    Ok(())
}

pub(crate) async fn get(api: &ApiArgs, job_id: &str) -> Result<(), Failure> {
    let job = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}"), None)
        .await?;
    show(api, &job, |job| {
        print_jobs(std::slice::from_ref(job));
        if let Some(step) = job["outstanding_step"].as_str() {
            println!("waiting on step: {step}");
        }
        if let Some(version) = job["workflow_version"].as_i64() {
            println!("workflow version: {version}");
        }
        for (step, failed) in job["failed_attempts"].as_object().into_iter().flatten() {
            println!("failed attempts of step {step}: {failed}");
        }
        for (step, at) in job["timers"].as_object().into_iter().flatten() {
            println!(
                "timer or wait deadline of step {step}: {}",
                at.as_str().unwrap_or("?")
            );
        }
        if let Some(at) = job["expires_at"].as_str() {
            println!("expires (execution_timeout_ms) at: {at}");
        }
        if let Some(key) = job["concurrency_key"].as_str() {
            let slot = if job["holds_slot"] == true {
                "holds a slot"
            } else {
                "holds no slot"
            };
            println!("concurrency key: {key} ({slot})");
        }
        if let Some(parent) = job["parent_job_id"].as_str() {
            let step = job["parent_step"].as_str().unwrap_or("?");
            println!("started by: {parent} (step {step})");
        }
        for child in job["children"].as_array().into_iter().flatten() {
            println!(
                "  child {}: {} {} ({})",
                child["step"].as_str().unwrap_or("?"),
                child["job_id"].as_str().unwrap_or(""),
                child["status"].as_str().unwrap_or(""),
                child["workflow_name"].as_str().unwrap_or(""),
            );
        }
        for checkpoint in job["checkpoints"].as_array().into_iter().flatten() {
            let timed_out = if checkpoint["timed_out"] == true {
                " (timed out)"
            } else {
                ""
            };
            println!(
                "  checkpoint {}{timed_out}: {}",
                checkpoint["name"].as_str().unwrap_or("?"),
                checkpoint["response"]
            );
        }
        if !job["result"].is_null() {
            println!("result: {}", job["result"]);
        }
    });
    Ok(())
}

pub(crate) async fn graph(api: &ApiArgs, job_id: &str) -> Result<(), Failure> {
    let graph = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}/graph"), None)
        .await?;
    show(api, &graph, |graph| {
        println!(
            "{}  {}",
            graph["job_id"].as_str().unwrap_or(""),
            graph["status"].as_str().unwrap_or("")
        );
        println!(
            "{:<24}  {:<10}  {:<9}  {:<30}  NOTE",
            "STEP", "STATE", "KIND", "NEEDS"
        );
        for node in graph["nodes"].as_array().into_iter().flatten() {
            let needs: Vec<&str> = node["needs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let note = if let Some(at) = node["wakes_at"].as_str() {
                format!("wakes at {at}")
            } else if let Some(done) = node["items_done"].as_u64() {
                format!("{done} items done")
            } else if let Some(pages) = node["pages"].as_u64() {
                format!("{pages} pages, cursor {}", node["cursor"])
            } else if let Some(call) = node["call"].as_str() {
                call.to_owned()
            } else {
                String::new()
            };
            println!(
                "{:<24}  {:<10}  {:<9}  {:<30}  {note}",
                node["name"].as_str().unwrap_or(""),
                node["state"].as_str().unwrap_or(""),
                node["kind"].as_str().unwrap_or(""),
                needs.join(", "),
            );
        }
    });
    Ok(())
}

pub(crate) async fn list(api: &ApiArgs, args: ListArgs) -> Result<(), Failure> {
    let metadata = metadata_arg(&args.metadata)?.map(|m| m.to_string());
    // Encoded as a form would be: names and labels may hold any text.
    let mut url = reqwest::Url::parse("http://query.invalid/v1/jobs").expect("a fixed URL");
    url.query_pairs_mut()
        .append_pair("limit", &args.limit.to_string());
    for (key, value) in [
        ("status", args.status),
        ("workflow_name", args.workflow),
        ("cursor", args.cursor),
        ("metadata", metadata),
    ] {
        if let Some(value) = value {
            url.query_pairs_mut().append_pair(key, &value);
        }
    }
    let path = format!("/v1/jobs?{}", url.query().unwrap_or_default());
    let page = api.call(Method::GET, &path, None).await?;
    show(api, &page, |page| {
        print_jobs(page["jobs"].as_array().map_or(&[], Vec::as_slice));
        if let Some(cursor) = page["next_cursor"].as_str() {
            println!("more: --cursor {cursor}");
        }
    });
    Ok(())
}

pub(crate) async fn complete(
    api: &ApiArgs,
    job_id: &str,
    step: &str,
    response: &str,
) -> Result<(), Failure> {
    let body = json!({ "response": json_arg(response, "the response")? });
    let outcome = api
        .call(
            Method::POST,
            &format!("/v1/jobs/{job_id}/steps/{step}/complete"),
            Some(&body),
        )
        .await?;
    show(api, &outcome, |o| {
        println!("{}", o["outcome"].as_str().unwrap_or(""))
    });
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct SignalArgs {
    job_id: String,
    /// The signal's name: what a `wait_for` step of the job waits for.
    name: String,
    /// The payload: JSON text, or @path to read it from a file.
    #[arg(default_value = "{}")]
    payload: String,
    /// Who sends it, as JSON.
    #[arg(long)]
    source: Option<String>,
    /// The same key twice is one signal; without one, each send is new.
    #[arg(long)]
    key: Option<String>,
}

pub(crate) async fn signal(api: &ApiArgs, args: SignalArgs) -> Result<(), Failure> {
    let mut body = json!({
        "name": args.name,
        "payload": json_arg(&args.payload, "the payload")?,
    });
    if let Some(source) = &args.source {
        body["source"] = json_arg(source, "--source")?;
    }
    if let Some(key) = args.key {
        body["idempotency_key"] = json!(key);
    }
    let receipt = api
        .call(
            Method::POST,
            &format!("/v1/jobs/{}/signals", args.job_id),
            Some(&body),
        )
        .await?;
    show(api, &receipt, |r| {
        let seq = r["seq"].as_i64().unwrap_or_default();
        let what = match (r["repeat"].as_bool(), r["woke_job"].as_bool()) {
            (Some(true), _) => "already received",
            (_, Some(true)) => "received; the job was waiting and is queued",
            _ => "received; kept until a step waits for it",
        };
        println!("signal {seq} {what}");
    });
    Ok(())
}

pub(crate) async fn signals(api: &ApiArgs, job_id: &str) -> Result<(), Failure> {
    let listed = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}/signals"), None)
        .await?;
    show(api, &listed, |listed| {
        for s in listed["signals"].as_array().map_or(&[][..], Vec::as_slice) {
            println!(
                "{:>4}  {:<9} {:<24} {}  {}",
                s["seq"],
                s["status"].as_str().unwrap_or(""),
                s["name"].as_str().unwrap_or(""),
                s["received_at"].as_str().unwrap_or(""),
                s["consumed_by"]
                    .as_str()
                    .map(|step| format!("taken by {step}"))
                    .unwrap_or_default(),
            );
        }
    });
    Ok(())
}

/// An operator's retry, moved to `workflow_version` (a number or
/// `latest`) when given.
pub(crate) async fn retry(
    api: &ApiArgs,
    job_id: &str,
    workflow_version: Option<String>,
) -> Result<(), Failure> {
    let body = match workflow_version.as_deref() {
        None => None,
        Some("latest") => Some(json!({ "workflow_version": "latest" })),
        Some(number) => {
            let version: i64 = number.parse().map_err(|_| {
                Failure::usage(anyhow::anyhow!(
                    "--workflow-version {number:?} is neither a number nor latest"
                ))
            })?;
            Some(json!({ "workflow_version": version }))
        }
    };
    post_verb(api, job_id, "retry", body).await
}

pub(crate) async fn verb(
    api: &ApiArgs,
    job_id: &str,
    verb: &str,
    reason: Option<String>,
) -> Result<(), Failure> {
    post_verb(
        api,
        job_id,
        verb,
        reason.map(|reason| json!({ "reason": reason })),
    )
    .await
}

/// `POST /v1/jobs/{id}/{verb}` with `body`, the job it answers printed.
async fn post_verb(
    api: &ApiArgs,
    job_id: &str,
    verb: &str,
    body: Option<Value>,
) -> Result<(), Failure> {
    let job = api
        .call(
            Method::POST,
            &format!("/v1/jobs/{job_id}/{verb}"),
            body.as_ref(),
        )
        .await?;
    show(api, &job, |job| print_jobs(std::slice::from_ref(job)));
    Ok(())
}
