//! `/v1/schedules`: create or replace, list, get, pause, resume and delete
//! the schedules that start workflows on a calendar or an interval.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::ApiState;
use crate::problem::{ApiJson, Problem, ProblemDoc};
use flotilla_engine::ops::schedules::{Put, ScheduleError, ScheduleSpec, ScheduleView};

/// A schedule: exactly one of `cron` (with `time_zone`, UTC by default)
/// and `interval`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScheduleBody {
    workflow_name: String,
    #[serde(default)]
    #[schema(value_type = Object)]
    input: Value,
    /// 5 fields (`0 9 * * 1-5`), or 6 with seconds first.
    #[serde(default)]
    cron: Option<String>,
    /// An IANA time zone, e.g. `Europe/Amsterdam`.
    #[serde(default)]
    time_zone: Option<String>,
    /// `30s`, `15m`, `1h` (1 s to 366 days).
    #[serde(default)]
    interval: Option<String>,
    /// `skip` (default): a tick more than a minute late starts nothing;
    /// `run_once`: the latest tick missed starts one job.
    #[serde(default)]
    missed: Option<String>,
}

/// Every schedule, by name.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SchedulesView {
    schedules: Vec<ScheduleView>,
}

#[utoipa::path(put, path = "/v1/schedules/{name}", params(("name" = String, Path)), request_body = ScheduleBody, responses((status = 201, description = "created", body = ScheduleView), (status = 200, description = "replaced (its next ticks are new jobs), or unchanged when it said this already", body = ScheduleView), (status = 400, description = "bad JSON, or a value the store cannot hold (`field`)", body = ProblemDoc, content_type = "application/problem+json"), (status = 413, description = "body too large", body = ProblemDoc, content_type = "application/problem+json"), (status = 415, description = "the body is not `application/json`", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "what cannot work, named: an unknown workflow, an input its schema refuses, a cron that does not parse, an unknown time zone, an interval out of range, both or neither of cron and interval, a body of the wrong shape", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn put(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<ScheduleBody>,
) -> Result<(StatusCode, axum::Json<ScheduleView>), Problem> {
    let spec = ScheduleSpec {
        name,
        workflow_name: body.workflow_name,
        input: body.input,
        cron: body.cron,
        time_zone: body.time_zone,
        interval: body.interval,
        missed: body.missed,
    };
    let (put, view) = state.engine.put_schedule(&spec).await?;
    let status = if put == Put::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(view)))
}

#[utoipa::path(get, path = "/v1/schedules", responses((status = 200, description = "every schedule by name, each with its next run", body = SchedulesView)), security(("bearer" = [])))]
pub(crate) async fn list(
    State(state): State<ApiState>,
) -> Result<axum::Json<SchedulesView>, Problem> {
    Ok(axum::Json(SchedulesView {
        schedules: state.engine.schedules().await?,
    }))
}

#[utoipa::path(get, path = "/v1/schedules/{name}", params(("name" = String, Path)), responses((status = 200, body = ScheduleView), (status = 400, description = "a name the store cannot hold", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "no such schedule", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<axum::Json<ScheduleView>, Problem> {
    Ok(axum::Json(state.engine.schedule(&name).await?))
}

#[utoipa::path(post, path = "/v1/schedules/{name}/pause", params(("name" = String, Path)), responses((status = 200, description = "paused: no tick starts a job", body = ScheduleView), (status = 400, description = "a name the store cannot hold", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "no such schedule", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn pause(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<axum::Json<ScheduleView>, Problem> {
    Ok(axum::Json(state.engine.pause_schedule(&name, true).await?))
}

#[utoipa::path(post, path = "/v1/schedules/{name}/resume", params(("name" = String, Path)), responses((status = 200, description = "resumed from its first tick after now (the ticks while paused are not started)", body = ScheduleView), (status = 400, description = "a name the store cannot hold", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "no such schedule", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn resume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<axum::Json<ScheduleView>, Problem> {
    Ok(axum::Json(state.engine.pause_schedule(&name, false).await?))
}

#[utoipa::path(delete, path = "/v1/schedules/{name}", params(("name" = String, Path)), responses((status = 204, description = "deleted; the jobs it started stay"), (status = 400, description = "a name the store cannot hold", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "no such schedule", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn delete(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<StatusCode, Problem> {
    state.engine.delete_schedule(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

impl From<ScheduleError> for Problem {
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::NotFound(_) => Self::not_found(e.to_string()),
            ScheduleError::Invalid(_) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
            ScheduleError::Unstorable(ref unstorable) => {
                let extra = json!({ "field": unstorable.field });
                Self::bad_request(e.to_string()).with(extra)
            }
            ScheduleError::Store(e) => e.into(),
        }
    }
}
