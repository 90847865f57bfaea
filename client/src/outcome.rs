//! How a job ended, as [`Submitter::submit_and_wait`] reports it: the
//! result decoded into the caller's type, or a typed error for every other
//! end (failed, dead, cancelled) and for a wait that ran out.
//!
//! [`Submitter::submit_and_wait`]: crate::Submitter::submit_and_wait

use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::submit_error::SubmitError;

/// Why a job waited on gave no result. The job's own ends ([`Failed`],
/// [`Dead`], [`Cancelled`]) are final until an operator retries it; a wait
/// that ran out ([`TimedOut`]) says nothing of the job, which may still
/// finish: wait again by its id.
///
/// [`Failed`]: WaitError::Failed
/// [`Dead`]: WaitError::Dead
/// [`Cancelled`]: WaitError::Cancelled
/// [`TimedOut`]: WaitError::TimedOut
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The submission itself failed (nothing to wait for), or the fleet
    /// refused to show the job (a token without the scope, say).
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// The job FAILED: its input, its definition, or a step's final answer.
    #[error("job {job_id} failed: {error}")]
    Failed { job_id: Uuid, error: String },
    /// The job went DEAD: a step ran out of attempts.
    #[error("job {job_id} is dead: {error}")]
    Dead { job_id: Uuid, error: String },
    /// The job was CANCELLED.
    #[error("job {job_id} was cancelled: {reason}")]
    Cancelled { job_id: Uuid, reason: String },
    /// The job COMPLETED, with a result that is not the type asked for.
    #[error("job {job_id} completed with a result that does not decode: {reason}")]
    Result { job_id: Uuid, reason: String },
    /// The wait ran out before the job finished (`last_error`: why the
    /// fleet could not be asked, when that was the reason).
    #[error("job {job_id} did not finish within the wait{}", last_error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default())]
    TimedOut {
        job_id: Uuid,
        last_error: Option<String>,
    },
}

/// A job's end as the fleet states it, before it is typed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ended {
    Completed(serde_json::Value),
    Failed(String),
    Dead(String),
    Cancelled(String),
}

impl Ended {
    /// From a job's status, result and error; `None` while it runs.
    pub(crate) fn from_status(
        status: &str,
        result: Option<serde_json::Value>,
        error: Option<String>,
    ) -> Option<Self> {
        let error = || error.clone().unwrap_or_default();
        Some(match status {
            "COMPLETED" => Self::Completed(result.clone().unwrap_or(serde_json::Value::Null)),
            "FAILED" => Self::Failed(error()),
            "DEAD" => Self::Dead(error()),
            "CANCELLED" => Self::Cancelled(error()),
            _ => return None,
        })
    }

    /// The result as `T`, or the end as its error.
    pub(crate) fn typed<T: DeserializeOwned>(self, job_id: Uuid) -> Result<T, WaitError> {
        match self {
            Self::Completed(result) => {
                serde_json::from_value(result).map_err(|e| WaitError::Result {
                    job_id,
                    reason: e.to_string(),
                })
            }
            Self::Failed(error) => Err(WaitError::Failed { job_id, error }),
            Self::Dead(error) => Err(WaitError::Dead { job_id, error }),
            Self::Cancelled(reason) => Err(WaitError::Cancelled { job_id, reason }),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_end_becomes_the_result_or_its_own_error_and_a_running_job_none() {
        let id = Uuid::new_v4();
        let done = Ended::from_status("COMPLETED", Some(json!({"n": 3})), None).unwrap();
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Answer {
            n: i32,
        }
        assert_eq!(done.clone().typed::<Answer>(id).unwrap(), Answer { n: 3 });
        assert!(matches!(
            done.typed::<Vec<String>>(id),
            Err(WaitError::Result { .. })
        ));
        let cases = [
            ("FAILED", "bad input"),
            ("DEAD", "3 of 3"),
            ("CANCELLED", "asked"),
        ];
        for (status, error) in cases {
            let ended = Ended::from_status(status, None, Some(error.into())).unwrap();
            let got = ended.typed::<serde_json::Value>(id).unwrap_err();
            let matched = match (&got, status) {
                (WaitError::Failed { error: e, .. }, "FAILED")
                | (WaitError::Dead { error: e, .. }, "DEAD")
                | (WaitError::Cancelled { reason: e, .. }, "CANCELLED") => e == error,
                _ => false,
            };
            assert!(matched, "{status}: {got:?}");
        }
        for running in ["QUEUED", "RUNNING", "WAITING"] {
            assert_eq!(Ended::from_status(running, None, None), None);
        }
    }
}
