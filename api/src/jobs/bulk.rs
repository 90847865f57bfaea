//! `POST /v1/jobs/bulk/retry` and `/v1/jobs/bulk/cancel`: every job a
//! filter matches, with a dry run that only counts (engine `ops/bulk.rs`).

use axum::extract::State;
use axum::http::StatusCode;
use flotilla_engine::ops::bulk::{BulkAction, BulkError, BulkOutcome, JobFilter};
use flotilla_engine::rows::RunStatus;
use serde::Deserialize;
use serde_json::json;

use crate::ApiState;
use crate::problem::{ApiJson, Problem, ProblemDoc};

/// Which jobs, and whether to act or only count.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkBody {
    filter: FilterBody,
    /// Only count the jobs that match; change nothing.
    #[serde(default)]
    dry_run: bool,
    /// The cancel's reason (cancel only).
    #[serde(default)]
    reason: Option<String>,
}

/// Every field given must hold; at least one must be given.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FilterBody {
    status: Option<String>,
    workflow_name: Option<String>,
    /// RFC 3339: created at or after.
    created_after: Option<String>,
    /// RFC 3339: created strictly before.
    created_before: Option<String>,
    /// Metadata every job holds (strings by key).
    #[schema(value_type = Option<Object>)]
    metadata: Option<serde_json::Value>,
}

/// What a bulk action did (or, with `dry_run`, would act on).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct BulkView {
    #[serde(flatten)]
    #[schema(value_type = Object)]
    outcome: BulkOutcome,
}

#[utoipa::path(post, path = "/v1/jobs/bulk/retry", request_body = BulkBody, responses((status = 200, description = "`matched`, `changed` (0 with `dry_run`), `passed_over` with the first reasons, `more` when over 10,000 match (call again)", body = BulkView), (status = 400, description = "no filter, a bad status or time, a reason given to a retry", body = ProblemDoc, content_type = "application/problem+json"), (status = 413, description = "body too large", body = ProblemDoc, content_type = "application/problem+json"), (status = 415, description = "the body is not `application/json`", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "a body of another shape (an unknown field, a filter that is not an object)", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn retry(
    State(state): State<ApiState>,
    ApiJson(body): ApiJson<BulkBody>,
) -> Result<axum::Json<BulkView>, Problem> {
    if body.reason.is_some() {
        return Err(
            Problem::bad_request("a retry takes no reason").with(json!({"field": "reason"}))
        );
    }
    run(&state, body, BulkAction::Retry).await
}

#[utoipa::path(post, path = "/v1/jobs/bulk/cancel", request_body = BulkBody, responses((status = 200, description = "as for bulk retry; a RUNNING job counts as changed once its cancel is recorded", body = BulkView), (status = 400, description = "no filter, a bad status or time, a reason the store cannot hold", body = ProblemDoc, content_type = "application/problem+json"), (status = 413, description = "body too large", body = ProblemDoc, content_type = "application/problem+json"), (status = 415, description = "the body is not `application/json`", body = ProblemDoc, content_type = "application/problem+json"), (status = 422, description = "a body of another shape (an unknown field, a filter that is not an object)", body = ProblemDoc, content_type = "application/problem+json")), security(("bearer" = [])))]
pub(crate) async fn cancel(
    State(state): State<ApiState>,
    ApiJson(mut body): ApiJson<BulkBody>,
) -> Result<axum::Json<BulkView>, Problem> {
    let reason = body
        .reason
        .take()
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "cancelled by an operator, by filter".to_owned());
    run(&state, body, BulkAction::Cancel { reason }).await
}

async fn run(
    state: &ApiState,
    body: BulkBody,
    action: BulkAction,
) -> Result<axum::Json<BulkView>, Problem> {
    let filter = filter(body.filter)?;
    let outcome = state
        .engine
        .bulk(&filter, &action, body.dry_run)
        .await
        .map_err(|e| match e {
            BulkError::Filter(e) => e.into(),
            BulkError::Unstorable(ref unstorable) => {
                let extra = json!({ "field": unstorable.field });
                Problem::bad_request(e.to_string()).with(extra)
            }
            BulkError::World { changed, source } => {
                let problem: Problem = source.into();
                problem.with(json!({ "changed": changed }))
            }
        })?;
    Ok(axum::Json(BulkView { outcome }))
}

fn filter(body: FilterBody) -> Result<JobFilter, Problem> {
    let bad = |field: &str, detail: String| {
        Problem::new(StatusCode::BAD_REQUEST, detail).with(json!({ "field": field }))
    };
    let status = match body.status.as_deref() {
        None => None,
        Some(raw) => Some(raw.parse::<RunStatus>().map_err(|_| {
            let allowed: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
            bad(
                "filter.status",
                format!("status {raw:?} is not one of {}", allowed.join(", ")),
            )
        })?),
    };
    let time = |field: &str, raw: Option<String>| {
        raw.map(|raw| {
            chrono::DateTime::parse_from_rfc3339(&raw)
                .map(|at| at.with_timezone(&chrono::Utc))
                .map_err(|e| bad(field, format!("{raw:?} is not an RFC 3339 time: {e}")))
        })
        .transpose()
    };
    let metadata = match body.metadata {
        None => None,
        Some(given) => {
            let entries: flotilla_engine::Metadata = serde_json::from_value(given)
                .map_err(|e| bad("filter.metadata", format!("not an object of strings: {e}")))?;
            flotilla_engine::check_metadata(&entries)
                .map_err(|e| bad("filter.metadata", e.to_string()))?;
            Some(json!(entries)).filter(|_| !entries.is_empty())
        }
    };
    let filter = JobFilter {
        status,
        created_after: time("filter.created_after", body.created_after)?,
        created_before: time("filter.created_before", body.created_before)?,
        workflow_name: body.workflow_name,
        metadata,
    };
    if filter.status.is_none()
        && filter.workflow_name.is_none()
        && filter.created_after.is_none()
        && filter.created_before.is_none()
        && filter.metadata.is_none()
    {
        return Err(bad(
            "filter",
            "an empty filter matches every job: give at least one of status, workflow_name, created_after, created_before, metadata".to_owned(),
        ));
    }
    Ok(filter)
}
