//! `docs/clients.md`'s "Submit and wait for the result" in Rust, line for
//! line between the markers (`scripts/check-quickstarts` holds the page
//! and this file to each other and runs this against the demo's fleet): it
//! exits 0 once the `order` job it submitted COMPLETED.
//!
//! ```text
//! source .services/demo/fleet.env
//! cargo run -p flotilla-examples --bin flotilla-example-await
//! ```

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    submit_and_wait().await
}

/// The page's block, as printed (not reformatted: the page is the source).
#[rustfmt::skip]
async fn submit_and_wait() -> anyhow::Result<()> {
    // await:begin
    use std::time::Duration;

    use flotilla_client::{SecretString, Submission, Submitter, WaitError};

    // The fleet's settings (`source .services/demo/fleet.env` sets the demo's).
    let url = std::env::var("FLOTILLA_URL").unwrap_or_else(|_| "http://localhost:8080".to_owned());
    let token = std::env::var("FLOTILLA_TOKEN").ok().map(SecretString::from);
    let api = Submitter::api(&url, token)?;
    let order = Submission::new("order", &serde_json::json!({"name": "Grace"}))?;
    match api.submit_and_wait::<serde_json::Value>(&order, Duration::from_secs(60)).await {
        Ok(result) => println!("job {} completed: {result}", order.job_id()),
        Err(WaitError::TimedOut { job_id, .. }) => anyhow::bail!("job {job_id} still runs: ask again later"),
        Err(e) => return Err(e.into()), // failed, dead or cancelled, or never submitted
    }
    // await:end
    Ok(())
}
