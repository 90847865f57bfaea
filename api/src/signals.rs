//! `/v1/jobs/{job_id}/signals`: send a signal to a job, and list the
//! signals it keeps. Every refusal carries a `code`, the same one a
//! signal from the topic is dead-lettered with.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use flotilla_engine::rows::SignalEntry;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::ApiState;
use crate::problem::{ApiJson, Problem, ProblemDoc};
use flotilla_engine::ops::signal::{Signal, SignalError, SignalReceipt};

/// A signal: `name` is what a `wait_for` step waits for.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignalBody {
    name: String,
    /// Any JSON (at most 64 KiB): the output of the step that takes it.
    #[serde(default)]
    #[schema(value_type = Object)]
    payload: Value,
    /// Who sent it (any JSON, at most 16 KiB).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    source: Value,
    /// The same key twice is one signal; without one, each request is a
    /// new signal.
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// A signal a job keeps.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SignalView {
    pub seq: i64,
    pub name: String,
    pub idempotency_key: String,
    #[schema(value_type = Object)]
    pub payload: Value,
    #[schema(value_type = Option<Object>)]
    pub source: Value,
    pub received_at: DateTime<Utc>,
    /// `PENDING` until a `wait_for` step takes it, then `CONSUMED`.
    #[schema(example = "PENDING")]
    pub status: &'static str,
    pub consumed_by: Option<String>,
    pub consumed_at: Option<DateTime<Utc>>,
}

impl From<SignalEntry> for SignalView {
    fn from(entry: SignalEntry) -> Self {
        Self {
            status: if entry.is_pending() {
                "PENDING"
            } else {
                "CONSUMED"
            },
            seq: entry.seq,
            name: entry.name,
            idempotency_key: entry.idempotency_key,
            payload: entry.payload,
            source: entry.source,
            received_at: entry.received_at,
            consumed_by: entry.consumed_by,
            consumed_at: entry.consumed_at,
        }
    }
}

/// A job's signals, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SignalsView {
    pub signals: Vec<SignalView>,
}

fn job_id(raw: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(raw)
        .map_err(|e| Problem::bad_request(format!("job id {raw:?} is not a UUID: {e}")))
}

#[utoipa::path(post, path = "/v1/jobs/{job_id}/signals", params(("job_id" = Uuid, Path)), request_body = SignalBody, responses((status = 202, description = "kept for the job (`woke_job`: it was waiting for it and is queued to take it)", body = SignalReceipt), (status = 200, description = "a repeat of a signal already kept under this key: its receipt", body = SignalReceipt), (status = 400, description = "bad id or body, a limit broken (`code: invalid`)", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job (`code: unknown_job`)", body = ProblemDoc, content_type = "application/problem+json"), (status = 409, description = "the job finished (`job_finished`), the key was used with other content (`conflict`), the job holds 100 signals none has taken (`signals_full`), or a newer release must take it (`too_new`)", body = ProblemDoc, content_type = "application/problem+json"), (status = 413, description = "body too large", body = ProblemDoc, content_type = "application/problem+json"), (status = 415, description = "the body is not `application/json`", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "no step of the job waits for this name (`not_awaited`), the payload misfits the waiting step's output schema (`payload_misfit`), or the body lacks a field or has one of the wrong type", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn send(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
    ApiJson(body): ApiJson<SignalBody>,
) -> Result<(StatusCode, axum::Json<SignalReceipt>), Problem> {
    let signal = Signal {
        job_id: job_id(&raw)?,
        name: body.name,
        payload: body.payload,
        source: body.source,
        idempotency_key: body
            .idempotency_key
            .unwrap_or_else(|| format!("api:{}", Uuid::new_v4())),
    };
    let receipt = state.engine.send_signal(signal).await?;
    let status = if receipt.repeat {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, axum::Json(receipt)))
}

#[utoipa::path(get, path = "/v1/jobs/{job_id}/signals", params(("job_id" = Uuid, Path)), responses((status = 200, description = "the signals the job keeps (at most 100), newest first", body = SignalsView), (status = 400, description = "malformed id", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
) -> Result<axum::Json<SignalsView>, Problem> {
    let kept = state.engine.signals(job_id(&raw)?).await?;
    Ok(axum::Json(SignalsView {
        signals: kept.into_iter().map(SignalView::from).collect(),
    }))
}

impl From<SignalError> for Problem {
    fn from(e: SignalError) -> Self {
        let code = e.code();
        let e = match e {
            // A failure of the world, not of this signal: 503 and the reason.
            SignalError::Store(store) if code.is_none() => return store.into(),
            e => e,
        };
        let status = match &e {
            SignalError::NotFound(_) => StatusCode::NOT_FOUND,
            SignalError::Invalid(_) => StatusCode::BAD_REQUEST,
            SignalError::NotAwaited { .. } | SignalError::Misfit { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            SignalError::Finished { .. }
            | SignalError::TimedOut { .. }
            | SignalError::Conflict { .. }
            | SignalError::Full { .. }
            | SignalError::TooNew { .. } => StatusCode::CONFLICT,
            // The store refused a value of the signal.
            SignalError::Store(_) => StatusCode::BAD_REQUEST,
        };
        let mut extra = json!({ "code": code });
        match &e {
            SignalError::Invalid(unstorable) => extra["field"] = json!(unstorable.field),
            SignalError::Misfit { violations, .. } => extra["violations"] = json!(violations),
            SignalError::Finished { status, .. } => extra["job_status"] = json!(status.as_str()),
            _ => {}
        }
        Self::new(status, e.to_string()).with(extra)
    }
}
