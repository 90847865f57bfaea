//! `/v1/workflows`: register, list and get stored definitions.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use flotilla_engine::rows::StoredDefinition;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::ApiState;
use crate::problem::{ApiJson, ApiQuery, Problem, ProblemDoc};

#[utoipa::path(put, path = "/v1/workflows/{name}", params(("name" = String, Path)), request_body(content = Object, description = "the workflow definition"), responses((status = 201, description = "new version"), (status = 200, description = "same as the newest version"), (status = 400, description = "name mismatch or bad JSON", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "every problem of the definition", body = ProblemDoc, content_type = "application/problem+json"), (status = 415, description = "the body is not `application/json`", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn put(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(document): ApiJson<Value>,
) -> Result<Response, Problem> {
    let named = document.get("name").and_then(Value::as_str);
    if named != Some(name.as_str()) {
        return Err(Problem::bad_request(format!(
            "the definition's name {named:?} does not match the route's {name:?}"
        )));
    }
    let registered = state.engine.register_workflow(&document).await?;
    let status = if registered.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(registered.definition)).into_response())
}

#[utoipa::path(get, path = "/v1/workflows", responses((status = 200, description = "`{workflows}`: newest version of each")), security(("bearer" = [])))]
pub(crate) async fn list(State(state): State<ApiState>) -> Result<axum::Json<Value>, Problem> {
    let workflows = state.engine.workflows().await?;
    Ok(axum::Json(json!({ "workflows": workflows })))
}

#[utoipa::path(get, path = "/v1/workflows/{name}", params(("name" = String, Path)), responses((status = 200, description = "the newest version"), (status = 404, description = "no such workflow", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<axum::Json<StoredDefinition>, Problem> {
    let stored = state
        .engine
        .workflow(&name)
        .await?
        .ok_or_else(|| Problem::not_found(format!("no workflow named {name:?}")))?;
    Ok(axum::Json(stored))
}

/// Which page of versions.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct VersionsQuery {
    /// Only versions older than this one (`next_before` of the previous page).
    before: Option<i32>,
    /// Versions per page: 50 unless given, at most 500.
    limit: Option<i64>,
}

#[utoipa::path(get, path = "/v1/workflows/{name}/versions", params(("name" = String, Path), VersionsQuery), responses((status = 200, description = "`{versions, next_before}`: a page of stored versions, newest first; `next_before` is where the next page starts, null on the last"), (status = 400, description = "a negative limit, or a malformed parameter", body = ProblemDoc, content_type = "application/problem+json"), (status = 404, description = "no such workflow (or nothing before `before`)", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn versions(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<VersionsQuery>,
) -> Result<axum::Json<Value>, Problem> {
    let (versions, next_before) = state
        .engine
        .workflow_versions(&name, query.before, query.limit.unwrap_or(0))
        .await?;
    if versions.is_empty() {
        return Err(Problem::not_found(format!("no workflow named {name:?}")));
    }
    Ok(axum::Json(
        json!({ "versions": versions, "next_before": next_before }),
    ))
}
