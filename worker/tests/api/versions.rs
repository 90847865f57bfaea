//! `POST /v1/jobs` naming the stored version a job runs.

use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::PgPool;

use super::{Api, MIGRATOR, approval};

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_submitted_with_a_workflow_version_runs_that_version(pool: PgPool) {
    let api = Api::start(&pool).await;
    let mut second = approval();
    second["max_attempts"] = json!(7);
    for document in [approval(), second] {
        let (status, _) = api
            .call(Method::PUT, "/v1/workflows/approval", Some(document))
            .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let submit = |body: serde_json::Value| api.call(Method::POST, "/v1/jobs", Some(body));
    let input = json!({"amount": 5});
    let (status, pinned) =
        submit(json!({"workflow_name": "approval", "workflow_version": 1, "input": input})).await;
    assert_eq!(
        (status, pinned["workflow_version"].clone()),
        (StatusCode::CREATED, json!(1))
    );
    let (status, newest) = submit(json!({"workflow_name": "approval", "input": input})).await;
    assert_eq!(
        (status, newest["workflow_version"].clone()),
        (StatusCode::CREATED, json!(2))
    );

    let (status, problem) =
        submit(json!({"workflow_name": "approval", "workflow_version": 5, "input": input})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("has no version 5"),
        "{problem}"
    );
    let (status, problem) =
        submit(json!({"workflow_name": "approval", "workflow_version": 0, "input": input})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_eq!(problem["field"], "workflow_version", "{problem}");
    let (status, problem) =
        submit(json!({"workflow": approval(), "workflow_version": 1, "input": input})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("workflow_name"),
        "{problem}"
    );
}
