//! `flotilla retry` and `cancel` by filter: `--status`, `--workflow`,
//! `--created-after`, `--created-before`, `--metadata` instead of a job id, `--dry-run`
//! to only count (`POST /v1/jobs/bulk/{retry,cancel}`).

use clap::Args;
use reqwest::Method;
use serde_json::{Value, json};

use crate::Failure;
use crate::client::ApiArgs;

/// Which jobs, when no job id is given.
#[derive(Debug, Args)]
pub(crate) struct FilterArgs {
    /// Every job in this status (QUEUED, RUNNING, WAITING, COMPLETED,
    /// FAILED, DEAD, CANCELLED).
    #[arg(long)]
    status: Option<String>,
    /// Every job of this workflow.
    #[arg(long = "workflow")]
    workflow_name: Option<String>,
    /// Jobs created at or after this time (RFC 3339).
    #[arg(long)]
    created_after: Option<String>,
    /// Jobs created before this time (RFC 3339).
    #[arg(long)]
    created_before: Option<String>,
    /// Jobs labelled `key=value`; give it again for more.
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    metadata: Vec<String>,
    /// Only count the jobs the filter matches; change nothing.
    #[arg(long)]
    dry_run: bool,
}

impl FilterArgs {
    /// Whether any part of a filter was given.
    pub(crate) fn given(&self) -> bool {
        self.status.is_some()
            || self.workflow_name.is_some()
            || self.created_after.is_some()
            || self.created_before.is_some()
            || !self.metadata.is_empty()
            || self.dry_run
    }
}

/// Retries (`verb` = `retry`) or cancels every job `filter` matches.
pub(crate) async fn run(
    api: &ApiArgs,
    verb: &str,
    filter: FilterArgs,
    reason: Option<String>,
) -> Result<(), Failure> {
    let mut body = json!({
        "filter": {
            "status": filter.status,
            "workflow_name": filter.workflow_name,
            "created_after": filter.created_after,
            "created_before": filter.created_before,
            "metadata": crate::jobs::metadata_arg(&filter.metadata)?,
        },
        "dry_run": filter.dry_run,
    });
    if let Some(reason) = reason {
        body["reason"] = json!(reason);
    }
    // Absent, not null: the API reads a missing field as no condition.
    if let Some(fields) = body["filter"].as_object_mut() {
        fields.retain(|_, value| !value.is_null());
    }
    let outcome = api
        .call(Method::POST, &format!("/v1/jobs/bulk/{verb}"), Some(&body))
        .await?;
    crate::jobs::show(api, &outcome, |outcome| print(verb, outcome));
    Ok(())
}

fn print(verb: &str, outcome: &Value) {
    let number = |field: &str| outcome[field].as_u64().unwrap_or_default();
    if outcome["dry_run"] == true {
        println!(
            "{} job(s) match; nothing changed (dry run)",
            number("matched")
        );
    } else {
        println!(
            "{} job(s) matched, {} {verb}, {} passed over",
            number("matched"),
            number("changed"),
            number("passed_over")
        );
    }
    for example in outcome["passed_over_examples"]
        .as_array()
        .into_iter()
        .flatten()
    {
        println!(
            "  {}  {}",
            example["job_id"].as_str().unwrap_or_default(),
            example["reason"].as_str().unwrap_or_default()
        );
    }
    if outcome["more"] == true {
        println!("more jobs match than one call acts on: run it again");
    }
}
