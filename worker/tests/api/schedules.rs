//! `/v1/schedules`: create (201), repeat or replace (200), list with the
//! next run, pause, resume, delete (204), each refusal with its status.

use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::PgPool;

use super::{Api, MIGRATOR, approval};

#[sqlx::test(migrator = "MIGRATOR")]
async fn schedules_are_created_listed_paused_resumed_and_deleted(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let body = json!({"workflow_name": "approval", "input": {"amount": 3}, "cron": "0 9 * * 1-5", "time_zone": "Europe/Amsterdam"});
    let (status, created) = api
        .call(
            Method::PUT,
            "/v1/schedules/weekday-morning",
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["missed"], "skip");
    assert!(created["next_run_at"].is_string());
    assert_eq!(
        api.call(Method::PUT, "/v1/schedules/weekday-morning", Some(body))
            .await
            .0,
        StatusCode::OK,
        "the same schedule again"
    );
    let every = json!({"workflow_name": "approval", "input": {"amount": 1}, "interval": "15m", "missed": "run_once"});
    assert_eq!(
        api.call(Method::PUT, "/v1/schedules/quarterly", Some(every))
            .await
            .0,
        StatusCode::CREATED
    );
    let (status, listed) = api.call(Method::GET, "/v1/schedules", None).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = listed["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["quarterly", "weekday-morning"]);
    assert_eq!(listed["schedules"][0]["interval"], "15m");

    let (status, paused) = api
        .call(Method::POST, "/v1/schedules/quarterly/pause", None)
        .await;
    assert_eq!(
        (status, paused["paused"].clone()),
        (StatusCode::OK, json!(true))
    );
    let (_, resumed) = api
        .call(Method::POST, "/v1/schedules/quarterly/resume", None)
        .await;
    assert_eq!(resumed["paused"], false);
    assert_eq!(
        api.call(Method::DELETE, "/v1/schedules/quarterly", None)
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        api.call(Method::GET, "/v1/schedules/quarterly", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        api.call(Method::DELETE, "/v1/schedules/quarterly", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_schedule_that_cannot_work_is_422_naming_why(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let cases = [
        (
            json!({"workflow_name": "ghost", "interval": "1m"}),
            "unknown workflow",
        ),
        (
            json!({"workflow_name": "approval", "input": {}, "interval": "1m"}),
            "input",
        ),
        (
            json!({"workflow_name": "approval", "input": {"amount": 1}, "cron": "daily"}),
            "cron",
        ),
        (
            json!({"workflow_name": "approval", "input": {"amount": 1}, "cron": "0 9 * * *", "time_zone": "Mars/Base"}),
            "time_zone",
        ),
        (
            json!({"workflow_name": "approval", "input": {"amount": 1}}),
            "exactly one",
        ),
        (
            json!({"workflow_name": "approval", "input": {"amount": 1}, "interval": "1m", "missed": "later"}),
            "missed",
        ),
    ];
    for (body, named) in cases {
        let (status, problem) = api
            .call(Method::PUT, "/v1/schedules/s", Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(
            problem["detail"].as_str().unwrap().contains(named),
            "{body}: {problem}"
        );
    }
    let (status, problem) = api
        .call(Method::PUT, "/v1/schedules/s", Some(json!({"workflow_name": "approval", "input": {"amount": 1, "x": "\u{0}"}, "interval": "1m"})))
        .await;
    assert_eq!(
        (status, problem["field"].clone()),
        (StatusCode::BAD_REQUEST, json!("input.x"))
    );
    let (_, listed) = api.call(Method::GET, "/v1/schedules", None).await;
    assert_eq!(listed["schedules"], json!([]), "nothing refused was stored");
}
