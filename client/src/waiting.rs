//! [`Submitter::submit_and_wait`]: submit, then wait for the job's end.
//!
//! Through the API, the submission asks to be answered once the job
//! finishes (`Prefer: wait`), and the job is then asked for again with
//! `?wait=` until it finishes or the caller's time runs out: each question
//! is a long poll the fleet answers the moment the job ends. Through
//! Kafka, the job's end is read from the event topic (`ends.rs`).

use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use uuid::Uuid;

use crate::outcome::{Ended, WaitError};
use crate::submit::{HTTP_TIMEOUT, Route, refusal, submit_to_api};
use crate::{Submission, SubmitError, Submitter};

/// The longest single question to the API: below its default request
/// timeout (30 s), which would answer a longer one 503.
const LONGEST_POLL: Duration = Duration::from_secs(25);

/// The pause before asking again after the API could not be reached.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

impl Submitter {
    /// Submits `submission` and waits at most `timeout` for the job to
    /// finish: its result decoded as `T` (`serde_json::Value` for any), or
    /// a [`WaitError`] saying how else it ended.
    ///
    /// Through the API it waits with long polls; through Kafka it reads the
    /// event topic from just before the submission. A repeat of a job id
    /// that already finished is answered at once through the API; through
    /// Kafka its end is not published again, so the wait runs out
    /// ([`WaitError::TimedOut`]): wait for a known job through the API.
    ///
    /// # Errors
    /// [`WaitError::Submit`] when the submission fails (see
    /// [`Submitter::submit`]); the job's own ends; [`WaitError::TimedOut`].
    pub async fn submit_and_wait<T: DeserializeOwned>(
        &self,
        submission: &Submission,
        timeout: Duration,
    ) -> Result<T, WaitError> {
        let deadline = Instant::now() + timeout;
        let job_id = submission.job_id();
        let ended = match &self.route {
            Route::Api {
                client,
                base_url,
                token,
            } => {
                let request = submission.request()?;
                let wait = timeout.min(LONGEST_POLL);
                let (_, job) = submit_to_api(
                    client,
                    base_url,
                    token.as_ref(),
                    &request,
                    submission.trace_context(),
                    Some(wait),
                )
                .await?;
                match ended_of(&job) {
                    Some(ended) => ended,
                    None => {
                        poll_until_ended(client, base_url, token.as_ref(), job_id, deadline).await?
                    }
                }
            }
            #[cfg(feature = "kafka")]
            Route::Kafka(kafka) => {
                // Watching from before the request is produced: its end
                // cannot slip past.
                let watch = kafka.ends.watch(job_id).await?;
                self.submit(submission).await?;
                watch.ended(deadline).await?
            }
        };
        ended.typed(job_id)
    }
}

/// The end a job's view states, if it has ended.
fn ended_of(job: &serde_json::Value) -> Option<Ended> {
    Ended::from_status(
        job["status"].as_str()?,
        job.get("result").filter(|r| !r.is_null()).cloned(),
        job["error"].as_str().map(str::to_owned),
    )
}

/// Asks for the job with `?wait=` until it has ended or `deadline` passes.
/// An API that cannot be reached is asked again; one that refuses the
/// question (a token without the scope, an unknown job) ends the wait.
async fn poll_until_ended(
    client: &reqwest::Client,
    base_url: &str,
    token: Option<&SecretString>,
    job_id: Uuid,
    deadline: Instant,
) -> Result<Ended, WaitError> {
    let url = format!("{base_url}/v1/jobs/{job_id}");
    let mut last_error = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(WaitError::TimedOut { job_id, last_error });
        }
        let wait = left.min(LONGEST_POLL);
        let mut call = client
            .get(format!("{url}?wait={}ms", wait.as_millis()))
            .timeout(wait + HTTP_TIMEOUT);
        if let Some(token) = token {
            call = call.bearer_auth(token.expose_secret());
        }
        let failure = match call.send().await {
            Ok(response) if response.status().is_success() => {
                match response.json::<serde_json::Value>().await {
                    Ok(job) => match ended_of(&job) {
                        Some(ended) => return Ok(ended),
                        None => continue,
                    },
                    Err(e) => SubmitError::Unavailable(format!("{url}: reading the answer: {e}")),
                }
            }
            Ok(response) => refusal(&url, response.status(), response).await,
            Err(e) => SubmitError::Unavailable(format!("{url}: {e}")),
        };
        if !failure.is_retryable() {
            return Err(failure.into());
        }
        last_error = Some(failure.to_string());
        let pause = RETRY_PAUSE.min(deadline.saturating_duration_since(Instant::now()));
        tokio::time::sleep(pause).await;
    }
}
