//! The demo target service (see `flotilla_demo::target`).

use clap::Parser;

#[derive(Debug, Parser)]
#[command(version, about = "The HTTP target the demo's workflows call")]
struct Cli {
    #[command(flatten)]
    target: flotilla_demo::target::TargetSettings,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    flotilla_demo::target::serve(Cli::parse().target).await
}
