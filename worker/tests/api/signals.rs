//! `/v1/jobs/{id}/signals`: a signal is 202 when kept, 200 when it repeats
//! a key, and each refusal has its status and its `code`; the history
//! lists what the job keeps, newest first.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use super::{Api, MIGRATOR};

fn awaiting() -> Value {
    json!({
        "name": "awaiting", "input_schema": {},
        "steps": [
            {"name": "prepare", "target": "echo", "method": "prepare"},
            {"name": "approved", "wait_for": "approval",
             "output_schema": {"type": "object", "required": ["by"]}}
        ]
    })
}

async fn submitted(api: &Api) -> Uuid {
    let job_id = Uuid::new_v4();
    let body = json!({"workflow_name": "awaiting", "input": {}, "job_id": job_id});
    assert_eq!(
        api.call(Method::POST, "/v1/jobs", Some(body)).await.0,
        StatusCode::CREATED
    );
    job_id
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_is_kept_repeated_by_key_and_listed_newest_first(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/awaiting", Some(awaiting()))
        .await;
    let job_id = submitted(&api).await;
    let path = format!("/v1/jobs/{job_id}/signals");
    let body = json!({"name": "approval", "payload": {"by": "ana"}, "source": {"user": "ana"}, "idempotency_key": "a-1"});

    let (status, receipt) = api.call(Method::POST, &path, Some(body.clone())).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
    assert_eq!(
        (receipt["seq"].clone(), receipt["repeat"].clone()),
        (json!(1), json!(false))
    );
    let (status, again) = api.call(Method::POST, &path, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "a repeat: {again}");
    assert_eq!(again["received_at"], receipt["received_at"]);

    let conflicting =
        json!({"name": "approval", "payload": {"by": "bo"}, "idempotency_key": "a-1"});
    let (status, problem) = api.call(Method::POST, &path, Some(conflicting)).await;
    assert_eq!(
        (status, problem["code"].clone()),
        (StatusCode::CONFLICT, json!("conflict"))
    );

    // Without a key, each request is a signal of its own.
    let unkeyed = json!({"name": "approval", "payload": {"by": "cy"}});
    assert_eq!(
        api.call(Method::POST, &path, Some(unkeyed.clone())).await.0,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        api.call(Method::POST, &path, Some(unkeyed)).await.0,
        StatusCode::ACCEPTED
    );

    let (status, history) = api.call(Method::GET, &path, None).await;
    assert_eq!(status, StatusCode::OK);
    let seqs: Vec<i64> = history["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [3, 2, 1], "newest first");
    assert_eq!(history["signals"][2]["status"], "PENDING");
    assert_eq!(history["signals"][2]["source"], json!({"user": "ana"}));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn each_refused_signal_has_its_status_and_code(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/awaiting", Some(awaiting()))
        .await;
    let job_id = submitted(&api).await;
    let path = format!("/v1/jobs/{job_id}/signals");
    let cases = [
        (
            format!("/v1/jobs/{}/signals", Uuid::new_v4()),
            json!({"name": "approval", "payload": {"by": "x"}}),
            StatusCode::NOT_FOUND,
            "unknown_job",
        ),
        (
            path.clone(),
            json!({"name": "refund", "payload": {}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "not_awaited",
        ),
        (
            path.clone(),
            json!({"name": "approval", "payload": {"who": "x"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "payload_misfit",
        ),
        (
            path.clone(),
            json!({"name": " ", "payload": {}}),
            StatusCode::BAD_REQUEST,
            "invalid",
        ),
        (
            path.clone(),
            json!({"name": "approval", "payload": {"by": "x"}, "idempotency_key": "k\u{0}"}),
            StatusCode::BAD_REQUEST,
            "invalid",
        ),
    ];
    for (at, body, status, code) in cases {
        let (got, problem) = api.call(Method::POST, &at, Some(body.clone())).await;
        assert_eq!(
            (got, problem["code"].as_str()),
            (status, Some(code)),
            "{body}: {problem}"
        );
    }
    let (status, _) = api
        .call(Method::POST, &path, Some(json!({"payload": {}})))
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a body without a name, as for every JSON body"
    );

    api.call(Method::POST, &format!("/v1/jobs/{job_id}/cancel"), None)
        .await;
    let (status, problem) = api
        .call(
            Method::POST,
            &path,
            Some(json!({"name": "approval", "payload": {"by": "x"}})),
        )
        .await;
    assert_eq!(
        (status, problem["code"].clone()),
        (StatusCode::CONFLICT, json!("job_finished"))
    );
    assert_eq!(problem["job_status"], "CANCELLED");
    let (_, history) = api.call(Method::GET, &path, None).await;
    assert_eq!(history["signals"], json!([]), "nothing refused was kept");
}
