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
    // The job's timeline says the version too, event by event.
    let pinned_id = pinned["job_id"].as_str().unwrap();
    let (status, timeline) = api
        .call(Method::GET, &format!("/v1/jobs/{pinned_id}/events"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        timeline["events"][0]["event_type"], "ACCEPTED",
        "{timeline}"
    );
    assert_eq!(timeline["events"][0]["workflow_version"], 1, "{timeline}");

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

/// `POST /v1/jobs/{id}/retry` with a `workflow_version` moves a finished
/// job to that version (or the latest), keeping the checkpoints of the
/// steps that did not change; a body that names no version is refused
/// naming the field, and no body is the plain retry.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_retry_may_move_a_job_to_the_latest_version(pool: PgPool) {
    let api = Api::start(&pool).await;
    let put = |document| api.call(Method::PUT, "/v1/workflows/approval", Some(document));
    assert_eq!(put(approval()).await.0, StatusCode::CREATED);
    let (status, job) = api
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "approval", "input": {"amount": 5}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let id = job["job_id"].as_str().unwrap().to_owned();
    let job_path = format!("/v1/jobs/{id}");
    // Parked on the person's step once `check` answered.
    api.engine.run_once().await.unwrap();
    assert_eq!(
        api.call(Method::GET, &job_path, None).await.1["status"],
        "WAITING"
    );
    let cancelled = api
        .call(Method::POST, &format!("{job_path}/cancel"), None)
        .await;
    assert_eq!(cancelled.0, StatusCode::OK, "{}", cancelled.1);
    let mut second = approval();
    second["steps"][1]["validate"] = json!(["response.ok == true", "has(response.by)"]);
    assert_eq!(put(second).await.0, StatusCode::CREATED);

    let retry_path = format!("{job_path}/retry");
    let retry = |body: Option<serde_json::Value>| api.call(Method::POST, &retry_path, body);
    for (body, field) in [
        (json!({"workflow_version": 0}), true),
        (json!({"workflow_version": "newest"}), true),
        (json!({"version": 2}), false),
    ] {
        let (status, problem) = retry(Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert_eq!(problem["field"] == "workflow_version", field, "{problem}");
    }
    let (status, problem) = retry(Some(json!({"workflow_version": 9}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");

    let (status, moved) = retry(Some(json!({"workflow_version": "latest"}))).await;
    assert_eq!(status, StatusCode::OK, "{moved}");
    assert_eq!(moved["workflow_version"], 2);
    let kept: Vec<&str> = moved["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(kept, ["check"], "the changed person's step runs again");
}

/// A job of a concurrency key shows its key, whether it holds a slot, and
/// (held back) why it waits, with no attempt spent.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_held_by_its_concurrency_key_shows_the_key_and_why(pool: PgPool) {
    let api = Api::start(&pool).await;
    let mut keyed = approval();
    keyed["concurrency"] = json!({"key": "input.account", "limit": 1});
    assert_eq!(
        api.call(Method::PUT, "/v1/workflows/approval", Some(keyed))
            .await
            .0,
        StatusCode::CREATED
    );
    let submit = || {
        api.call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "approval", "input": {"amount": 5, "account": "ada"}})),
        )
    };
    let (_, first) = submit().await;
    let (_, second) = submit().await;
    for job in [&first, &second] {
        assert_eq!(job["concurrency_key"], "approval/ada", "{job}");
        assert_eq!(job["holds_slot"], false, "{job}");
    }
    // The first parks holding its slot; the second is held back.
    api.engine.run_once().await.unwrap();
    api.engine.run_once().await.unwrap();
    let get = async |job: &serde_json::Value| {
        let path = format!("/v1/jobs/{}", job["job_id"].as_str().unwrap());
        api.call(Method::GET, &path, None).await
    };
    let (_, first) = get(&first).await;
    assert_eq!(
        (first["status"].clone(), first["holds_slot"].clone()),
        (json!("WAITING"), json!(true))
    );
    let (_, second) = get(&second).await;
    assert_eq!(
        (
            second["status"].clone(),
            second["holds_slot"].clone(),
            second["attempt"].clone()
        ),
        (json!("QUEUED"), json!(false), json!(0))
    );
    assert!(
        second["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("held by its concurrency key approval/ada: 1 of 1 slots taken"),
        "{second}"
    );
}
