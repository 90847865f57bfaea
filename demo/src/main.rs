//! `flotilla-demo`: runs the sample workflows through a running fleet and
//! checks the outcome (see `flotilla_demo::driver`). Exits 1 when any job
//! ended otherwise than its sample asked.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Runs sample workflows through a fleet and checks every outcome"
)]
struct Cli {
    #[command(flatten)]
    driver: flotilla_demo::driver::DriverSettings,
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let as_asked = flotilla_demo::driver::run(Cli::parse().driver).await?;
    Ok(if as_asked {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}
