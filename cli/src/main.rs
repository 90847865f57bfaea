//! `flotilla`: the command-line client. The API verbs talk to a worker
//! (`FLOTILLA_URL`, `FLOTILLA_TOKEN`); `produce` and `tail` talk to Kafka.
//!
//! Exit codes: 0 done; 1 unreachable, not delivered or a server error; 2 bad
//! usage or input; 3 not found; 4 conflict or wrong state; 5 not authorised;
//! 6 (`tail --until-terminal`) the job ended other than COMPLETED.

mod client;
mod jobs;
mod produce;
mod tail;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "flotilla",
    version,
    about = "Drive a Flotilla fleet from the command line"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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
    /// Retry a DEAD, FAILED or CANCELLED job.
    Retry {
        #[command(flatten)]
        api: client::ApiArgs,
        job_id: String,
    },
    /// Cancel a QUEUED or WAITING job.
    Cancel {
        #[command(flatten)]
        api: client::ApiArgs,
        job_id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Register, show and list workflow definitions.
    Workflows {
        #[command(flatten)]
        api: client::ApiArgs,
        #[command(subcommand)]
        command: jobs::WorkflowsCommand,
    },
    /// Follow the event topic and print events.
    Tail(tail::TailArgs),
    /// Produce a WorkflowRunRequest to the request topic (Avro when a schema
    /// registry is configured, JSON otherwise) and print its job id.
    Produce(produce::ProduceArgs),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Produce(args) => produce::run(args).await,
        Command::Submit { api, args } => jobs::submit(&api, args).await,
        Command::Get { api, job_id } => jobs::get(&api, &job_id).await,
        Command::List { api, args } => jobs::list(&api, args).await,
        Command::Complete {
            api,
            job_id,
            step,
            response,
        } => jobs::complete(&api, &job_id, &step, &response).await,
        Command::Retry { api, job_id } => jobs::verb(&api, &job_id, "retry", None).await,
        Command::Cancel {
            api,
            job_id,
            reason,
        } => jobs::verb(&api, &job_id, "cancel", reason).await,
        Command::Workflows { api, command } => jobs::workflows(&api, command).await,
        Command::Tail(args) => tail::run(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("flotilla: {:#}", failure.error);
            std::process::ExitCode::from(failure.exit_code)
        }
    }
}

/// An error with the exit code scripts can rely on.
#[derive(Debug)]
pub struct Failure {
    pub error: anyhow::Error,
    pub exit_code: u8,
}

impl Failure {
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Self {
            error: error.into(),
            exit_code: 2,
        }
    }

    pub fn delivery(error: impl Into<anyhow::Error>) -> Self {
        Self {
            error: error.into(),
            exit_code: 1,
        }
    }
}
