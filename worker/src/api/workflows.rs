//! `/v1/workflows`: register, list and get stored definitions.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::ApiState;
use super::problem::{ApiJson, Problem, ProblemDoc};
use crate::engine::RegisterError;
use crate::store::definitions;

#[utoipa::path(put, path = "/v1/workflows/{name}", params(("name" = String, Path)), request_body(content = Object, description = "the workflow definition"), responses((status = 201, description = "new version"), (status = 200, description = "same as the newest version"), (status = 400, description = "name mismatch or bad JSON", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "every problem of the definition", body = ProblemDoc, content_type = "application/problem+json"), (status = 401, description = "no token", body = ProblemDoc, content_type = "application/problem+json"), (status = 403, description = "wrong token", body = ProblemDoc, content_type = "application/problem+json"), (status = 503, description = "database unavailable", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub async fn put(
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
    let before = {
        let mut conn = state.engine.pool().acquire().await?;
        definitions::newest(&mut conn, &name)
            .await?
            .map(|d| d.version)
    };
    match state.engine.register_workflow(&document).await {
        Ok(stored) => {
            let status = if before == Some(stored.version) {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            Ok((status, axum::Json(stored)).into_response())
        }
        Err(RegisterError::Invalid(invalid)) => Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            invalid.to_string(),
        )
        .with(json!({ "problems": invalid.problems }))),
        Err(RegisterError::Database(e)) => Err(e.into()),
        Err(other) => Err(Problem::bad_request(other.to_string())),
    }
}

#[utoipa::path(get, path = "/v1/workflows", responses((status = 200, description = "`{workflows}`: newest version of each"), (status = 401, description = "no token", body = ProblemDoc, content_type = "application/problem+json"), (status = 403, description = "wrong token", body = ProblemDoc, content_type = "application/problem+json"), (status = 503, description = "database unavailable", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub async fn list(State(state): State<ApiState>) -> Result<axum::Json<Value>, Problem> {
    let mut conn = state.engine.pool().acquire().await?;
    let workflows = definitions::list_newest(&mut conn).await?;
    Ok(axum::Json(json!({ "workflows": workflows })))
}

#[utoipa::path(get, path = "/v1/workflows/{name}", params(("name" = String, Path)), responses((status = 200, description = "the newest version"), (status = 404, description = "no such workflow", body = ProblemDoc, content_type = "application/problem+json"), (status = 401, description = "no token", body = ProblemDoc, content_type = "application/problem+json"), (status = 403, description = "wrong token", body = ProblemDoc, content_type = "application/problem+json"), (status = 503, description = "database unavailable", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub async fn get(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<axum::Json<definitions::StoredDefinition>, Problem> {
    let mut conn = state.engine.pool().acquire().await?;
    let stored = definitions::newest(&mut conn, &name)
        .await?
        .ok_or_else(|| Problem::not_found(format!("no workflow named {name:?}")))?;
    Ok(axum::Json(stored))
}
