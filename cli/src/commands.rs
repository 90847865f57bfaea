//! The command line: every subcommand and where it goes.

use clap::{Parser, Subcommand};

use crate::failure::Failure;
use crate::{bulk, client, dlq, jobs, produce, schedules, tail, workflows};

#[derive(Debug, Parser)]
#[command(
    name = "flotilla",
    version,
    about = "Drive a Flotilla fleet from the command line"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Submit a job (stored workflow by name, or an inline definition).
    Submit {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(flatten)]
        args: jobs::SubmitArgs,
    },
    /// Show one job, its checkpoints and its result.
    Get {
        #[command(flatten)]
        api: client::ApiArgs,
        job_id: String,
    },
    /// Show a job's steps as a graph: each with its state and its needs.
    Graph {
        #[command(flatten)]
        api: client::ApiArgs,
        job_id: String,
    },
    /// List jobs, newest first.
    List {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(flatten)]
        args: jobs::ListArgs,
    },
    /// Complete a job's external step with a response (JSON or @file).
    Complete {
        #[command(flatten)]
        api: client::ApiArgs,
        job_id: String,
        step: String,
        response: String,
    },
    /// Send a signal to a job: what its `wait_for` step of that name takes.
    Signal {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(flatten)]
        args: jobs::SignalArgs,
    },
    /// List the signals a job keeps, newest first.
    Signals {
        #[command(flatten)]
        api: client::ApiArgs,
        job_id: String,
    },
    /// Retry a DEAD, FAILED or CANCELLED job, or every job a filter
    /// matches (`--status`, `--workflow`, `--created-after`,
    /// `--created-before`; `--dry-run` only counts).
    Retry {
        #[command(flatten)]
        api: client::ApiArgs,
        job_id: Option<String>,
        #[command(flatten)]
        filter: bulk::FilterArgs,
        /// Move it to this stored version of its workflow (a number, or
        /// `latest`), keeping the checkpoints of the steps that did not change.
        #[arg(long)]
        workflow_version: Option<String>,
    },
    /// Cancel a job (a RUNNING one is ended by its worker at its next heartbeat, or sooner when it parks, sleeps or ends),
    /// or every job a filter matches (as for retry).
    Cancel {
        #[command(flatten)]
        api: client::ApiArgs,
        job_id: Option<String>,
        #[command(flatten)]
        filter: bulk::FilterArgs,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Write, check, register and compare workflow definitions.
    Workflows {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: workflows::WorkflowsCommand,
    },
    /// Create, list, pause, resume and delete schedules.
    Schedules {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: schedules::SchedulesCommand,
    },
    /// Follow the event topic and print events.
    Tail(tail::TailArgs),
    /// Produce a WorkflowRunRequest to the request topic (Avro when a schema
    /// registry is configured, JSON otherwise) and print its job id.
    Produce(produce::ProduceArgs),
    /// Produce a WorkflowRunSignal to the signal topic (Avro when a schema
    /// registry is configured, JSON otherwise).
    ProduceSignal(produce::ProduceSignalArgs),
    /// The request topic's dead letters: list them, show one, replay one
    /// corrected under its job id.
    Dlq(dlq::DlqArgs),
}

impl Command {
    /// Runs the command.
    ///
    /// # Errors
    /// A [`Failure`] with the exit code scripts rely on.
    pub(crate) async fn run(self) -> Result<(), Failure> {
        match self {
            Command::Produce(args) => produce::run(args).await,
            Command::ProduceSignal(args) => produce::run_signal(args).await,
            Command::Signal { api, args } => jobs::signal(&api, args).await,
            Command::Signals { api, job_id } => jobs::signals(&api, &job_id).await,
            Command::Submit { api, args } => jobs::submit(&api, args).await,
            Command::Get { api, job_id } => jobs::get(&api, &job_id).await,
            Command::Graph { api, job_id } => jobs::graph(&api, &job_id).await,
            Command::List { api, args } => jobs::list(&api, args).await,
            Command::Complete {
                api,
                job_id,
                step,
                response,
            } => jobs::complete(&api, &job_id, &step, &response).await,
            Command::Retry {
                api,
                job_id,
                filter,
                workflow_version,
            } => match one_or_filter(job_id, &filter)? {
                Some(job_id) => jobs::retry(&api, &job_id, workflow_version).await,
                None if workflow_version.is_some() => Err(Failure::usage(anyhow::anyhow!(
                    "--workflow-version moves one job: give its id, not a filter"
                ))),
                None => bulk::run(&api, "retry", filter, None).await,
            },
            Command::Cancel {
                api,
                job_id,
                filter,
                reason,
            } => match one_or_filter(job_id, &filter)? {
                Some(job_id) => jobs::verb(&api, &job_id, "cancel", reason).await,
                None => bulk::run(&api, "cancel", filter, reason).await,
            },
            Command::Workflows { api, command } => workflows::run(&api, command).await,
            Command::Schedules { api, command } => schedules::run(&api, command).await,
            Command::Tail(args) => tail::run(args).await,
            Command::Dlq(args) => dlq::run(args).await,
        }
    }
}

/// A job id, or `None` for a filter: one of the two, not both.
fn one_or_filter(
    job_id: Option<String>,
    filter: &bulk::FilterArgs,
) -> Result<Option<String>, Failure> {
    match (job_id, filter.given()) {
        (Some(_), true) => Err(Failure::usage(anyhow::anyhow!(
            "give a job id or a filter (--status, --workflow, --created-after, --created-before, --dry-run), not both"
        ))),
        (None, false) => Err(Failure::usage(anyhow::anyhow!(
            "give a job id, or a filter (--status, --workflow, --created-after, --created-before)"
        ))),
        (job_id, _) => Ok(job_id),
    }
}
