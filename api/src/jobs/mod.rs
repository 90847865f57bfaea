//! `/v1/jobs`: submit, get (with the job's children), list, complete-step,
//! retry, cancel; a submission or a get may wait for the job to finish
//! (`waits.rs`). Handlers parse, call the engine, and answer; errors map
//! to problems in [`crate::errors`]. The 401, 403 and 503 answers every route shares are
//! added to the document in [`crate::openapi`].

pub(crate) mod bulk;
mod waits;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use flotilla_engine::rows::RunStatus;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::ApiState;
use crate::auth::{self, Granted, Scope};
use crate::problem::{ApiJson, ApiQuery, Problem, ProblemDoc};
use crate::views::{JobPageView, JobView, TimelineView};
use flotilla_engine::ops::graph_view::GraphView;
use flotilla_engine::{
    Cancelled, CompleteOutcome, GraftOutcome, JobQuery, RefusalMode, Submission, Submitted,
    WorkflowRef,
};
pub(crate) use waits::RequestDeadline;

fn job_id(raw: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(raw)
        .map_err(|e| Problem::bad_request(format!("job id {raw:?} is not a UUID: {e}")))
}

/// Exactly one of `workflow` (inline definition) and `workflow_name`;
/// `workflow_version` only with `workflow_name`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubmitBody {
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    workflow: Option<Value>,
    #[serde(default)]
    workflow_name: Option<String>,
    /// The stored version to run (from 1); without it, the newest.
    #[serde(default)]
    #[schema(minimum = 1)]
    workflow_version: Option<i32>,
    #[serde(default)]
    #[schema(value_type = Object)]
    input: Value,
    #[serde(default)]
    job_id: Option<Uuid>,
    /// Labels on the job: at most 16 entries, keys of letters, digits,
    /// `_`, `-` and `.` (1 to 64 characters), string values up to 256
    /// characters. Kept with the job, echoed on its events, searchable.
    #[serde(default)]
    metadata: Option<flotilla_engine::Metadata>,
    /// 0 to 10 (default 0): a head start in the queue of a minute per point
    /// over jobs of lower priority.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 10)]
    priority: Option<i32>,
}

#[utoipa::path(post, path = "/v1/jobs", request_body = SubmitBody, params(("Prefer" = Option<String>, Header, description = "`wait=<seconds>` (RFC 7240): answer 200 with the finished job if it finishes within that many seconds (bounded by the request timeout), else as without it")), responses((status = 201, description = "new job (not finished within a `Prefer: wait`)", body = JobView), (status = 200, description = "idempotent repeat, or the job finished within a `Prefer: wait`", body = JobView), (status = 400, description = "both or neither workflow fields, bad JSON", body = ProblemDoc, content_type = "application/problem+json"), (status = 409, description = "same job id, different content", body = ProblemDoc, content_type = "application/problem+json"), (status = 410, description = "idempotent repeat of a job whose run retention removed (code `removed`, `final_status`, `finished_at`, `removed_at`)", body = ProblemDoc, content_type = "application/problem+json"), (status = 413, description = "body too large", body = ProblemDoc, content_type = "application/problem+json"), (status = 415, description = "the body is not `application/json`", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "unknown workflow or version, invalid definition or input", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn submit(
    State(state): State<ApiState>,
    Extension(Granted(scopes)): Extension<Granted>,
    headers: axum::http::HeaderMap,
    deadline: Option<Extension<RequestDeadline>>,
    ApiJson(body): ApiJson<SubmitBody>,
) -> Result<Response, Problem> {
    let wait = waits::preferred(&headers)
        .map(|asked| waits::bounded(asked, deadline.map(|Extension(d)| d)));
    // An inline definition is code the workers run with their credentials:
    // it needs the scope that registers workflows, and the operator can
    // refuse it outright.
    if body.workflow.is_some() {
        if !state.inline_definitions {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                "inline definitions are switched off on this fleet (FLOTILLA_INLINE_DEFINITIONS=false): register the workflow and submit it by `workflow_name`",
            ));
        }
        if !scopes.has(Scope::Define) {
            return Err(auth::lacks(Scope::Define));
        }
    }
    // The caller's trace context, as a Kafka producer's would be: the run
    // joins the caller's trace (a malformed one is dropped at admission).
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (caller_traceparent, caller_tracestate) = (header("traceparent"), header("tracestate"));
    // The submission's server span continues the caller's trace; the run
    // keeps this span's context, so the job's spans hang under it (without
    // trace export the caller's context is kept as is).
    let span = tracing::info_span!(
        "submit",
        otel.name = "POST /v1/jobs",
        otel.kind = "server",
        http.request.method = "POST",
        http.route = "/v1/jobs",
        trace_id = flotilla_runtime::trace::trace_id(caller_traceparent.as_deref()),
    );
    let (traceparent, tracestate) =
        flotilla_runtime::trace::enter_trace(&span, caller_traceparent, caller_tracestate);
    let workflow = match (body.workflow, body.workflow_name) {
        (Some(_), None) if body.workflow_version.is_some() => {
            return Err(Problem::bad_request(
                "`workflow_version` names a stored version: give it with `workflow_name`, not with an inline `workflow`",
            ));
        }
        (Some(document), None) => WorkflowRef::Inline(document),
        (None, Some(name)) => match body.workflow_version {
            Some(version) => WorkflowRef::Version(name, version),
            None => WorkflowRef::Stored(name),
        },
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
    let priority = match body.priority {
        None => 0,
        Some(p) => i16::try_from(p)
            .ok()
            .filter(|p| (0..=flotilla_engine::MAX_PRIORITY).contains(p))
            .ok_or_else(|| {
                Problem::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "priority is 0 to {}, got {p}",
                        flotilla_engine::MAX_PRIORITY
                    ),
                )
                .with(json!({ "field": "priority" }))
            })?,
    };
    if let Some(metadata) = &body.metadata {
        flotilla_engine::check_metadata(metadata).map_err(|e| {
            Problem::bad_request(e.to_string()).with(json!({ "field": "metadata" }))
        })?;
    }
    let submission = Submission {
        metadata: body.metadata,
        priority,
        job_id: body.job_id.unwrap_or_else(Uuid::new_v4),
        workflow,
        input: if body.input.is_null() {
            json!({})
        } else {
            body.input
        },
        traceparent,
        tracestate,
    };
    let submitted = state.engine.submit(submission, RefusalMode::Refuse);
    let (status, row) = match tracing::Instrument::instrument(submitted, span).await? {
        Submitted::Created(row) => (StatusCode::CREATED, row),
        Submitted::Existing(row) => (StatusCode::OK, row),
        // A repeat whose run is gone: said so, with what it came to.
        Submitted::Removed(removed) => {
            return Err(Problem::new(
                StatusCode::GONE,
                format!(
                    "job {} was submitted before with this content; it ended {} at {} and its run was removed by retention at {}",
                    removed.job_id,
                    removed.status.as_str(),
                    removed.finished_at.to_rfc3339(),
                    removed.removed_at.to_rfc3339()
                ),
            )
            .with(json!({
                "code": "removed",
                "job_id": removed.job_id,
                "final_status": removed.status.as_str(),
                "finished_at": removed.finished_at,
                "removed_at": removed.removed_at,
            })));
        }
    };
    let Some(wait) = wait else {
        return Ok((status, axum::Json(JobView::from(row))).into_response());
    };
    // The preference is honoured (bounded): say how long it waited at most.
    let applied = [("preference-applied", format!("wait={}", wait.as_secs()))];
    let row = if row.status.is_finished() {
        row
    } else {
        let id = row.job_id;
        state
            .engine
            .job_when_finished(id, wait)
            .await?
            .unwrap_or(row)
    };
    // Finished within the wait: 200, as a repeat of a finished job is.
    let status = if row.status.is_finished() {
        StatusCode::OK
    } else {
        status
    };
    Ok((status, applied, axum::Json(JobView::from(row))).into_response())
}

#[utoipa::path(get, path = "/v1/jobs/{job_id}", params(("job_id" = Uuid, Path, description = "the job id"), GetQuery), responses((status = 200, description = "the job; with `wait`, as soon as it finishes, or as it is when the wait runs out", body = JobView), (status = 400, description = "malformed id or wait", body = ProblemDoc, content_type = "application/problem+json"), (status = 400, description = "malformed id", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
    ApiQuery(query): ApiQuery<GetQuery>,
    deadline: Option<Extension<RequestDeadline>>,
) -> Result<axum::Json<JobView>, Problem> {
    let wait = waits::from_query(query.wait.as_deref())?;
    let row = match wait {
        None => row_of(&state, &raw).await?,
        Some(asked) => {
            let id = job_id(&raw)?;
            let wait = waits::bounded(asked, deadline.map(|Extension(d)| d));
            state
                .engine
                .job_when_finished(id, wait)
                .await?
                .ok_or_else(|| Problem::not_found(format!("job {id} not found")))?
        }
    };
    let children = state.engine.children_of(row.job_id).await?;
    let mut view = JobView::from(row);
    view.children = children;
    Ok(axum::Json(view))
}

/// The query of a job's view.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct GetQuery {
    /// Wait up to this long for the job to finish before answering (`30s`,
    /// `500ms`, or whole seconds), bounded by the request's timeout.
    wait: Option<String>,
}

/// The row of the job `raw` names: 400 for a malformed id, 404 unknown.
async fn row_of(state: &ApiState, raw: &str) -> Result<flotilla_engine::rows::RunRow, Problem> {
    let id = job_id(raw)?;
    state
        .engine
        .job(id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("job {id} not found")))
}

#[utoipa::path(get, path = "/v1/jobs/{job_id}/graph", params(("job_id" = Uuid, Path, description = "the job id")), responses((status = 200, description = "every step of the job with its state, its needs and dependants, items done, the last cursor and the instant a timer wakes", body = GraphView), (status = 400, description = "malformed id", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "the job's definition cannot be drawn (written by another version)", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn graph(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
) -> Result<axum::Json<GraphView>, Problem> {
    let row = row_of(&state, &raw).await?;
    flotilla_engine::ops::graph_view::of(&row)
        .map(axum::Json)
        .map_err(|e| Problem::new(StatusCode::UNPROCESSABLE_ENTITY, e))
}

#[utoipa::path(get, path = "/v1/jobs/{job_id}/events", params(("job_id" = Uuid, Path, description = "the job id")), responses((status = 200, description = "the job's events still in the outbox, by sequence (retention may have deleted the oldest)", body = TimelineView), (status = 400, description = "malformed id", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn events(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
) -> Result<axum::Json<TimelineView>, Problem> {
    let id = job_id(&raw)?;
    let events = state
        .engine
        .job_timeline(id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("job {id} not found")))?;
    Ok(axum::Json(TimelineView { events }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    status: Option<String>,
    workflow_name: Option<String>,
    /// RFC 3339: only jobs created at or after it.
    created_after: Option<String>,
    /// RFC 3339: only jobs created before it.
    created_before: Option<String>,
    limit: Option<i64>,
    cursor: Option<String>,
    /// Only jobs whose metadata holds every entry of this JSON object of
    /// strings, e.g. `{"customer":"ada"}` (URL-encoded).
    metadata: Option<String>,
}

/// A metadata filter: a JSON object of strings, keys as the contract
/// allows them (400 naming `metadata` otherwise).
pub(crate) fn metadata_filter(raw: Option<&str>) -> Result<Option<Value>, Problem> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    let bad = |detail: String| Problem::bad_request(detail).with(json!({ "field": "metadata" }));
    let entries: flotilla_engine::Metadata = serde_json::from_str(raw).map_err(|e| {
        bad(format!(
            "metadata {raw:?} is not a JSON object of strings: {e}"
        ))
    })?;
    flotilla_engine::check_metadata(&entries).map_err(|e| bad(e.to_string()))?;
    Ok(Some(json!(entries)))
}

fn timestamp(name: &str, raw: Option<&str>) -> Result<Option<DateTime<Utc>>, Problem> {
    raw.filter(|r| !r.is_empty())
        .map(|r| {
            DateTime::parse_from_rfc3339(r)
                .map(|at| at.with_timezone(&Utc))
                .map_err(|e| {
                    Problem::bad_request(format!("{name} {r:?} is not an RFC 3339 time: {e}"))
                })
        })
        .transpose()
}

#[utoipa::path(get, path = "/v1/jobs", params(ListQuery), responses((status = 200, description = "newest first", body = JobPageView), (status = 400, description = "bad status, time, limit or cursor", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<axum::Json<JobPageView>, Problem> {
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
    let query = JobQuery {
        status,
        created_after: timestamp("created_after", query.created_after.as_deref())?,
        created_before: timestamp("created_before", query.created_before.as_deref())?,
        workflow_name: query.workflow_name,
        limit: query.limit.unwrap_or(0),
        cursor: query.cursor,
        metadata: metadata_filter(query.metadata.as_deref())?,
    };
    Ok(axum::Json(state.engine.jobs(&query).await?.into()))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteBody {
    #[schema(value_type = Object)]
    response: Value,
}

#[utoipa::path(post, path = "/v1/jobs/{job_id}/steps/{step_name}/complete", params(("job_id" = Uuid, Path), ("step_name" = String, Path)), request_body = CompleteBody, responses((status = 200, description = "`{outcome: COMPLETED | ALREADY_DONE}`"), (status = 400, description = "bad id or body", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json"), (status = 409, description = "wrong state; the body has the job's `job_status` and `outstanding_step`, or `code: step_timed_out` when the step's timeout_ms passed", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "response rejected; the job failed", body = ProblemDoc, content_type = "application/problem+json"), (status = 415, description = "the body is not `application/json`", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn complete(
    State(state): State<ApiState>,
    Path((raw, step)): Path<(String, String)>,
    ApiJson(body): ApiJson<CompleteBody>,
) -> Result<Response, Problem> {
    let id = job_id(&raw)?;
    match state.engine.complete_step(id, &step, body.response).await? {
        outcome @ (CompleteOutcome::Completed | CompleteOutcome::AlreadyDone) => {
            Ok(axum::Json(outcome).into_response())
        }
        CompleteOutcome::WrongState {
            status,
            outstanding_step,
        } => {
            let parked = outstanding_step
                .as_deref()
                .map(|s| format!(" on step {s}"))
                .unwrap_or_default();
            let detail = format!("job {id} is {status}{parked}, not waiting on step {step}");
            // `status` is the problem's HTTP status (RFC 9457): the job's
            // own goes beside it.
            Err(Problem::new(StatusCode::CONFLICT, detail)
                .with(json!({ "job_status": status, "outstanding_step": outstanding_step })))
        }
        CompleteOutcome::TimedOut => Err(Problem::new(
            StatusCode::CONFLICT,
            format!("step {step} of job {id} stopped waiting: its timeout_ms passed"),
        )
        .with(json!({ "code": "step_timed_out" }))),
        CompleteOutcome::Rejected { violations } => {
            let detail = format!(
                "the response was rejected and job {id} failed: {}",
                violations.join("; ")
            );
            Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, detail)
                .with(json!({ "violations": violations })))
        }
    }
}

/// An operator's retry may move the job to another stored version of its
/// workflow: a number, or `"latest"`. Without a body, the job runs the
/// version it ran.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryBody {
    #[schema(value_type = Object, example = json!(3))]
    workflow_version: Value,
}

#[utoipa::path(post, path = "/v1/jobs/{job_id}/retry", params(("job_id" = Uuid, Path)), request_body(content = Option<RetryBody>, description = "optional: `{\"workflow_version\": 3}` or `{\"workflow_version\": \"latest\"}` moves the job, keeping the checkpoints of the steps that did not change"), responses((status = 200, body = JobView), (status = 400, description = "malformed id or body", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json"), (status = 409, description = "not DEAD, FAILED or CANCELLED", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "an inline definition, or a version the workflow never had", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn retry(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
    body: axum::body::Bytes,
) -> Result<axum::Json<JobView>, Problem> {
    let id = job_id(&raw)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        let row = state.engine.retry(id).await?;
        return Ok(axum::Json(row.into()));
    }
    let bad = |detail: String| {
        Problem::new(StatusCode::BAD_REQUEST, detail).with(json!({ "field": "workflow_version" }))
    };
    let body: RetryBody = serde_json::from_slice(&body)
        .map_err(|e| Problem::new(StatusCode::BAD_REQUEST, format!("the body: {e}")))?;
    let version = match &body.workflow_version {
        Value::String(latest) if latest == "latest" => None,
        Value::Number(n) => Some(
            n.as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .filter(|n| *n >= 1)
                .ok_or_else(|| bad(format!("workflow_version {n} is not a version (from 1)")))?,
        ),
        other => {
            return Err(bad(format!(
                "workflow_version must be a number from 1 or \"latest\", not {other}"
            )));
        }
    };
    let (row, _run_again) = state.engine.retry_onto(id, version).await?;
    Ok(axum::Json(row.into()))
}

/// Steps to append to a job's definition, at the revision the caller saw.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GraftBody {
    revision: i32,
    /// Step definitions, as in a workflow's `steps`.
    #[schema(value_type = Vec<Object>)]
    steps: Value,
}

/// A graft's answer: the job, and whether this was a repeat of a graft
/// already made (nothing written).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct GraftView {
    repeat: bool,
    job: JobView,
}

#[utoipa::path(post, path = "/v1/jobs/{job_id}/graft", params(("job_id" = Uuid, Path)), request_body = GraftBody, responses((status = 200, description = "grafted, or a repeat of a graft already made", body = GraftView), (status = 400, description = "bad id or body", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json"), (status = 409, description = "a stale revision, or the job has finished", body = ProblemDoc, content_type = "application/problem+json"), (status = 413, description = "body too large", body = ProblemDoc, content_type = "application/problem+json"), (status = 415, description = "the body is not `application/json`", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "the combined definition is invalid (problems named by step)", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn graft(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
    ApiJson(body): ApiJson<GraftBody>,
) -> Result<axum::Json<GraftView>, Problem> {
    let id = job_id(&raw)?;
    let outcome = state.engine.graft(id, body.revision, &body.steps).await?;
    Ok(axum::Json(match outcome {
        GraftOutcome::Grafted(row) => GraftView {
            repeat: false,
            job: (*row).into(),
        },
        GraftOutcome::Repeat(row) => GraftView {
            repeat: true,
            job: (*row).into(),
        },
    }))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelBody {
    #[serde(default)]
    reason: Option<String>,
}

#[utoipa::path(post, path = "/v1/jobs/{job_id}/cancel", params(("job_id" = Uuid, Path)), request_body(content = Option<CancelBody>), responses((status = 200, description = "cancelled (it was QUEUED or WAITING)", body = JobView), (status = 202, description = "RUNNING: the request is recorded and the worker holding the job ends it CANCELLED at its next heartbeat, or sooner when its segment parks, sleeps or ends (a completion included)", body = JobView), (status = 400, description = "bad id or body", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "unknown job", body = ProblemDoc, content_type = "application/problem+json"), (status = 409, description = "already finished", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn cancel(
    State(state): State<ApiState>,
    Path(raw): Path<String>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, axum::Json<JobView>), Problem> {
    // The body is optional: `{"reason": "..."}` or nothing.
    let body: CancelBody = if body.iter().all(u8::is_ascii_whitespace) {
        CancelBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| Problem::bad_request(format!("request body: {e}")))?
    };
    let reason = body.reason.unwrap_or_default();
    Ok(match state.engine.cancel(job_id(&raw)?, &reason).await? {
        Cancelled::Done(row) => (StatusCode::OK, axum::Json(JobView::from(*row))),
        // RUNNING: the request is recorded; its worker ends it CANCELLED at
        // its next heartbeat or its next write out of RUNNING.
        Cancelled::Asked(row) => (StatusCode::ACCEPTED, axum::Json(JobView::from(*row))),
    })
}
