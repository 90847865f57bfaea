//! `flotilla`: the command-line client. The API verbs talk to a worker
//! (`FLOTILLA_URL`, `FLOTILLA_TOKEN`); `produce` and `tail` talk to Kafka.
//!
//! Exit codes: 0 done; 1 unreachable, not delivered or a server error; 2 bad
//! usage or input; 3 not found; 4 conflict or wrong state; 5 not authorised;
//! 6 (`tail --until-terminal`) the job ended other than COMPLETED.

mod bulk;
mod client;
mod commands;
mod dlq;
mod failure;
mod jobs;
mod produce;
mod schedules;
mod tail;
mod workflows;

use clap::Parser as _;

pub use failure::Failure;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match commands::Cli::parse().command.run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("flotilla: {:#}", failure.error);
            std::process::ExitCode::from(failure.exit_code)
        }
    }
}
