//! `flotilla`: the command-line client. For now it produces run requests
//! straight to Kafka; the API verbs (submit, get, list, complete, …) arrive
//! with the API issue.
//!
//! Exit codes: 0 done, 1 the request could not be delivered, 2 bad usage or input.

mod produce;

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
    /// Produce a WorkflowRunRequest to the request topic (Avro when a schema
    /// registry is configured, JSON otherwise) and print its job id.
    Produce(produce::ProduceArgs),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Produce(args) => produce::run(args).await,
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
