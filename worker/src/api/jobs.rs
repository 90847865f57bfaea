//! `/v1/jobs`: submit, get, list, complete-step, retry, cancel.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

use super::ApiState;
use super::problem::{ApiJson, Problem, ProblemDoc};
use crate::engine::{
    CompleteError, CompleteOutcome, OperatorError, RefusalMode, Submission, SubmitError, Submitted,
    WorkflowRef,
};
use crate::store::runs::{self, RunRow, RunStatus};

/// A job as the API returns it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct JobView {
    pub job_id: Uuid,
    pub workflow_name: String,
    pub workflow_version: Option<i32>,
    #[schema(value_type = String, example = "QUEUED")]
    pub status: RunStatus,
    pub attempt: i32,
    pub max_attempts: i32,
    pub run_after: DateTime<Utc>,
    pub outstanding_step: Option<String>,
    #[schema(value_type = Object)]
    pub input: Value,
    #[schema(value_type = Object)]
    pub checkpoints: Value,
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    pub verdict: Option<String>,
    pub error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<RunRow> for JobView {
    fn from(row: RunRow) -> Self {
        Self {
            status: row.status(),
            job_id: row.job_id,
            workflow_name: row.workflow_name,
            workflow_version: row.workflow_version,
            attempt: row.attempt,
            max_attempts: row.max_attempts,
            run_after: row.run_after,
            outstanding_step: row.outstanding_step,
            input: row.input.0,
            checkpoints: row.checkpoints.0,
            result: row.result.map(|r| r.0),
            verdict: row.verdict,
            error: row.error,
            lease_owner: row.lease_owner,
            lease_until: row.lease_until,
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

fn job_id(raw: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(raw)
        .map_err(|e| Problem::bad_request(format!("job id {raw:?} is not a UUID: {e}")))
}

/// Exactly one of `workflow` (inline definition) and `workflow_name`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    workflow: Option<Value>,
    #[serde(default)]
    workflow_name: Option<String>,
    #[serde(default)]
    #[schema(value_type = Object)]
    input: Value,
    #[serde(default)]
    job_id: Option<Uuid>,
}

#[utoipa::path(post, path = "/v1/jobs", request_body = SubmitBody, responses((status = 201, description = "new job", body = JobView), (status = 200, description = "idempotent repeat", body = JobView), (status = 400, description = "both or neither workflow fields, bad JSON", body = ProblemDoc, content_type = "application/problem+json"), (status = 409, description = "same job id, different content", body = ProblemDoc, content_type = "application/problem+json"), (status = 413, description = "body too large", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "unknown workflow, invalid definition or input", body = ProblemDoc, content_type = "application/problem+json"), (status = 401, description = "no token", body = ProblemDoc, content_type = "application/problem+json"), (status = 403, description = "wrong token", body = ProblemDoc, content_type = "application/problem+json"), (status = 503, description = "database unavailable", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub async fn submit(
    State(state): State<ApiState>,
    ApiJson(body): ApiJson<SubmitBody>,
) -> Result<Response, Problem> {
    let workflow = match (body.workflow, body.workflow_name) {
        (Some(document), None) => WorkflowRef::Inline(document),
        (None, Some(name)) => WorkflowRef::Stored(name),
        (Some(_), Some(_)) => {
            return Err(Problem::bad_request(
                "give exactly one of `workflow` and `workflow_name`, not both",
            ));
        }
        (None, None) => {
            return Err(Problem::bad_request(
                "give exactly one of `workflow` (inline) and `workflow_name` (stored)",
            ));
        }
    };
    let job_id = body.job_id.unwrap_or_else(Uuid::new_v4);
    let input = if body.input.is_null() {
        json!({})
    } else {
        body.input
    };
    let submission = Submission {
        job_id,
        workflow,
        input,
        traceparent: None,
    };
    match state.engine.submit(submission, RefusalMode::Refuse).await {
        Ok(Submitted::Created(row)) => {
            Ok((StatusCode::CREATED, axum::Json(JobView::from(row))).into_response())
        }
        Ok(Submitted::Existing(row)) => {
            Ok((StatusCode::OK, axum::Json(JobView::from(row))).into_response())
        }
        Err(SubmitError::Conflict(id)) => Err(Problem::new(
            StatusCode::CONFLICT,
            format!("job {id} exists with different content"),
        )),
        Err(SubmitError::UnknownWorkflow(name)) => Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("unknown workflow {name:?}"),
        )),
        Err(SubmitError::InvalidDefinition(invalid)) => Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            invalid.to_string(),
        )
        .with(json!({ "problems": invalid.problems }))),
        Err(SubmitError::InvalidInput {
            workflow,
            violations,
        }) => Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "input does not match the input schema of {workflow}: {}",
                violations.join("; ")
            ),
        )
        .with(json!({ "violations": violations }))),
        Err(SubmitError::Store(e)) => Err(e.into()),
    }
}

#[utoipa::path(get, path = "/v1/jobs/{job_id}", params(("job_id" = String, Path, description = "the job id (UUID)")), responses((status = 200, body = JobView), (status = 400, description = "malformed id", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json"), (status = 401, description = "no token", body = ProblemDoc, content_type = "application/problem+json"), (status = 403, description = "wrong token", body = ProblemDoc, content_type = "application/problem+json"), (status = 503, description = "database unavailable", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub async fn get(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
) -> Result<axum::Json<JobView>, Problem> {
    let id = job_id(&raw)?;
    let mut conn = state.engine.pool().acquire().await?;
    let row = runs::get(&mut conn, id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("job {id} not found")))?;
    Ok(axum::Json(row.into()))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    status: Option<String>,
    workflow_name: Option<String>,
    limit: Option<i64>,
    cursor: Option<String>,
}

/// Page size when `limit` is 0 or absent, and the most one page holds.
const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 500;

#[utoipa::path(get, path = "/v1/jobs", params(ListQuery), responses((status = 200, description = "`{jobs, next_cursor}`, newest first"), (status = 400, description = "bad status, limit or cursor", body = ProblemDoc, content_type = "application/problem+json"), (status = 401, description = "no token", body = ProblemDoc, content_type = "application/problem+json"), (status = 403, description = "wrong token", body = ProblemDoc, content_type = "application/problem+json"), (status = 503, description = "database unavailable", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub async fn list(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<axum::Json<Value>, Problem> {
    let status = match query.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(raw) => Some(raw.parse::<RunStatus>().map_err(|_| {
            let allowed: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
            Problem::bad_request(format!(
                "status {raw:?} is not one of {}",
                allowed.join(", ")
            ))
        })?),
    };
    let limit = match query.limit.unwrap_or(0) {
        0 => DEFAULT_LIMIT,
        n if n < 0 => return Err(Problem::bad_request(format!("limit {n} is negative"))),
        n => n.min(MAX_LIMIT),
    };
    let before = query
        .cursor
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(parse_cursor)
        .transpose()?;
    let mut conn = state.engine.pool().acquire().await?;
    let mut rows = runs::list(
        &mut conn,
        status,
        query.workflow_name.as_deref().filter(|w| !w.is_empty()),
        before,
        limit + 1,
    )
    .await?;
    let next_cursor = (rows.len() > usize::try_from(limit).unwrap_or(usize::MAX)).then(|| {
        rows.truncate(usize::try_from(limit).unwrap_or(0));
        rows.last()
            .map(|row| format!("{}_{}", row.created_at.timestamp_micros(), row.job_id))
    });
    let jobs: Vec<JobView> = rows.into_iter().map(JobView::from).collect();
    Ok(axum::Json(
        json!({ "jobs": jobs, "next_cursor": next_cursor.flatten() }),
    ))
}

/// `<created_at micros>_<job_id>`, as `list` hands it out.
fn parse_cursor(raw: &str) -> Result<(DateTime<Utc>, Uuid), Problem> {
    let bad = || Problem::bad_request(format!("cursor {raw:?} is not one this API handed out"));
    let (micros, id) = raw.split_once('_').ok_or_else(bad)?;
    let at = micros
        .parse::<i64>()
        .ok()
        .and_then(DateTime::from_timestamp_micros)
        .ok_or_else(bad)?;
    Ok((at, Uuid::parse_str(id).map_err(|_| bad())?))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteBody {
    #[schema(value_type = Object)]
    response: Value,
}

#[utoipa::path(post, path = "/v1/jobs/{job_id}/steps/{step_name}/complete", params(("job_id" = String, Path), ("step_name" = String, Path)), request_body = CompleteBody, responses((status = 200, description = "`{outcome: COMPLETED | ALREADY_DONE}`"), (status = 400, description = "bad id or body", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json"), (status = 409, description = "wrong state; the body has the job status", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "response rejected; the job failed", body = ProblemDoc, content_type = "application/problem+json"), (status = 401, description = "no token", body = ProblemDoc, content_type = "application/problem+json"), (status = 403, description = "wrong token", body = ProblemDoc, content_type = "application/problem+json"), (status = 503, description = "database unavailable", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub async fn complete(
    State(state): State<ApiState>,
    Path((raw, step)): Path<(String, String)>,
    ApiJson(body): ApiJson<CompleteBody>,
) -> Result<Response, Problem> {
    let id = job_id(&raw)?;
    match state.engine.complete_step(id, &step, body.response).await {
        Ok(outcome @ (CompleteOutcome::Completed | CompleteOutcome::AlreadyDone)) => {
            Ok(axum::Json(outcome).into_response())
        }
        Ok(CompleteOutcome::WrongState {
            status,
            outstanding_step,
        }) => Err(Problem::new(
            StatusCode::CONFLICT,
            format!(
                "job {id} is {status}{}, not waiting on step {step}",
                outstanding_step
                    .as_deref()
                    .map(|s| format!(" on step {s}"))
                    .unwrap_or_default()
            ),
        )
        .with(json!({ "status": status, "outstanding_step": outstanding_step }))),
        Ok(CompleteOutcome::Rejected { violations }) => Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "the response was rejected and job {id} failed: {}",
                violations.join("; ")
            ),
        )
        .with(json!({ "violations": violations }))),
        Err(CompleteError::NotFound(id)) => Err(Problem::not_found(format!("job {id} not found"))),
        Err(CompleteError::Store(e)) => Err(e.into()),
    }
}

fn operator_problem(e: OperatorError) -> Problem {
    match e {
        OperatorError::NotFound(id) => Problem::not_found(format!("job {id} not found")),
        e @ OperatorError::WrongState { .. } => Problem::new(StatusCode::CONFLICT, e.to_string()),
        OperatorError::Store(e) => e.into(),
    }
}

#[utoipa::path(post, path = "/v1/jobs/{job_id}/retry", params(("job_id" = String, Path)), responses((status = 200, body = JobView), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json"), (status = 409, description = "not DEAD, FAILED or CANCELLED", body = ProblemDoc, content_type = "application/problem+json"), (status = 401, description = "no token", body = ProblemDoc, content_type = "application/problem+json"), (status = 403, description = "wrong token", body = ProblemDoc, content_type = "application/problem+json"), (status = 503, description = "database unavailable", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub async fn retry(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
) -> Result<axum::Json<JobView>, Problem> {
    let row = state
        .engine
        .retry(job_id(&raw)?)
        .await
        .map_err(operator_problem)?;
    Ok(axum::Json(row.into()))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    #[serde(default)]
    reason: Option<String>,
}

#[utoipa::path(post, path = "/v1/jobs/{job_id}/cancel", params(("job_id" = String, Path)), request_body(content = Option<CancelBody>), responses((status = 200, body = JobView), (status = 400, description = "bad body", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json"), (status = 409, description = "not QUEUED or WAITING", body = ProblemDoc, content_type = "application/problem+json"), (status = 401, description = "no token", body = ProblemDoc, content_type = "application/problem+json"), (status = 403, description = "wrong token", body = ProblemDoc, content_type = "application/problem+json"), (status = 503, description = "database unavailable", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub async fn cancel(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
    body: axum::body::Bytes,
) -> Result<axum::Json<JobView>, Problem> {
    // The body is optional: `{"reason": "..."}` or nothing.
    let body: CancelBody = if body.iter().all(u8::is_ascii_whitespace) {
        CancelBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| Problem::bad_request(format!("request body: {e}")))?
    };
    let reason = body.reason.unwrap_or_default();
    let row = state
        .engine
        .cancel(job_id(&raw)?, &reason)
        .await
        .map_err(operator_problem)?;
    Ok(axum::Json(row.into()))
}
