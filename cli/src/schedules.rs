//! `flotilla schedules`: create or replace, list, show, pause, resume and
//! delete the schedules that start workflows on a calendar or an interval.

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

use crate::Failure;
use crate::client::ApiArgs;
use crate::jobs::{json_arg, show};

#[derive(Debug, Subcommand)]
pub(crate) enum SchedulesCommand {
    /// Create a schedule, or replace what it says (its next ticks are new jobs).
    Put(PutArgs),
    /// Every schedule with its next run.
    List,
    /// One schedule.
    Get { name: String },
    /// Stop a schedule's ticks from starting jobs.
    Pause { name: String },
    /// Start ticking again from the first tick after now.
    Resume { name: String },
    /// Delete a schedule (the jobs it started stay).
    Delete { name: String },
}

#[derive(Debug, Args)]
pub(crate) struct PutArgs {
    name: String,
    /// The stored workflow each tick starts.
    #[arg(long)]
    workflow: String,
    /// Its input: JSON, or @path.
    #[arg(long, default_value = "{}")]
    input: String,
    /// A cron expression: 5 fields, or 6 with seconds first.
    #[arg(long, conflicts_with = "every", required_unless_present = "every")]
    cron: Option<String>,
    /// The IANA time zone of the cron expression (default UTC).
    #[arg(long, requires = "cron")]
    time_zone: Option<String>,
    /// An interval instead of a cron expression: `30s`, `15m`, `1h`.
    #[arg(long)]
    every: Option<String>,
    /// What a tick missed while no worker ran becomes: `skip` or `run_once`.
    #[arg(long)]
    missed: Option<String>,
}

fn print(schedules: &[Value]) {
    println!(
        "{:<24}  {:<20}  {:<28}  {:<6}  {:<24}  LAST JOB",
        "NAME", "WORKFLOW", "WHEN", "PAUSED", "NEXT RUN"
    );
    for s in schedules {
        let when = match (s["cron"].as_str(), s["interval"].as_str()) {
            (Some(cron), _) => format!("{cron} ({})", s["time_zone"].as_str().unwrap_or("UTC")),
            (None, Some(every)) => format!("every {every}"),
            (None, None) => String::new(),
        };
        println!(
            "{:<24}  {:<20}  {:<28}  {:<6}  {:<24}  {}",
            s["name"].as_str().unwrap_or(""),
            s["workflow_name"].as_str().unwrap_or(""),
            when,
            s["paused"],
            s["next_run_at"].as_str().unwrap_or(""),
            s["last_job_id"].as_str().unwrap_or("-"),
        );
    }
}

pub(crate) async fn run(api: &ApiArgs, command: SchedulesCommand) -> Result<(), Failure> {
    let one = |schedule: &Value| print(std::slice::from_ref(schedule));
    match command {
        SchedulesCommand::Put(args) => {
            let mut body = json!({
                "workflow_name": args.workflow,
                "input": json_arg(&args.input, "--input")?,
            });
            for (field, value) in [
                ("cron", args.cron),
                ("time_zone", args.time_zone),
                ("interval", args.every),
                ("missed", args.missed),
            ] {
                if let Some(value) = value {
                    body[field] = json!(value);
                }
            }
            let path = format!("/v1/schedules/{}", args.name);
            let stored = api.call(Method::PUT, &path, Some(&body)).await?;
            show(api, &stored, one);
        }
        SchedulesCommand::List => {
            let all = api.call(Method::GET, "/v1/schedules", None).await?;
            show(api, &all, |all| {
                print(all["schedules"].as_array().map_or(&[][..], Vec::as_slice));
            });
        }
        SchedulesCommand::Get { name } => {
            let path = format!("/v1/schedules/{name}");
            let schedule = api.call(Method::GET, &path, None).await?;
            show(api, &schedule, one);
        }
        SchedulesCommand::Pause { name } => {
            let path = format!("/v1/schedules/{name}/pause");
            let schedule = api.call(Method::POST, &path, None).await?;
            show(api, &schedule, one);
        }
        SchedulesCommand::Resume { name } => {
            let path = format!("/v1/schedules/{name}/resume");
            let schedule = api.call(Method::POST, &path, None).await?;
            show(api, &schedule, one);
        }
        SchedulesCommand::Delete { name } => {
            api.call(Method::DELETE, &format!("/v1/schedules/{name}"), None)
                .await?;
            if !api.json {
                println!("deleted {name}");
            }
        }
    }
    Ok(())
}
