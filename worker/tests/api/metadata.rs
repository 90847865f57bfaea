//! Metadata on jobs through the API: kept and shown, searched with
//! `?metadata=`, used by the bulk filter, echoed on events; labels past
//! the contract's bounds refused naming the field.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::{Api, MIGRATOR};

async fn submit(api: &Api, metadata: Value) -> (StatusCode, Value) {
    api.call(
        Method::POST,
        "/v1/jobs",
        Some(json!({"workflow_name": "approval", "input": {"amount": 1}, "metadata": metadata})),
    )
    .await
}

/// `GET /v1/jobs?metadata=<the JSON object, URL-encoded>`.
async fn search(api: &Api, filter: Value) -> (StatusCode, Value) {
    let mut url = reqwest::Url::parse("http://query.invalid/v1/jobs").unwrap();
    url.query_pairs_mut()
        .append_pair("metadata", &filter.to_string());
    let path = format!("/v1/jobs?{}", url.query().unwrap());
    api.call(Method::GET, &path, None).await
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn labelled_jobs_are_shown_searched_acted_on_and_echoed_on_events(pool: PgPool) {
    let api = Api::start(&pool).await;
    let (status, _) = api
        .call(
            Method::PUT,
            "/v1/workflows/approval",
            Some(crate::approval()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let mut ada = Vec::new();
    for n in 0..3 {
        let (status, job) = submit(&api, json!({"customer": "ada", "batch": format!("{n}")})).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        assert_eq!(job["metadata"]["customer"], "ada", "{job}");
        ada.push(job["job_id"].as_str().unwrap().to_owned());
    }
    let (_, grace) = submit(&api, json!({"customer": "grace"})).await;
    let (_, unlabelled) = submit(&api, json!({})).await;
    assert_eq!(unlabelled["metadata"], Value::Null, "an empty map is none");

    let (status, page) = search(&api, json!({"customer": "ada"})).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let mut found: Vec<String> = page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap().to_owned())
        .collect();
    found.sort();
    ada.sort();
    assert_eq!(found, ada);
    let (_, page) = search(&api, json!({"customer": "ada", "batch": "1"})).await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 1, "{page}");

    // The bulk filter takes metadata too: only grace's job is cancelled.
    let (status, outcome) = api
        .call(
            Method::POST,
            "/v1/jobs/bulk/cancel",
            Some(json!({"filter": {"metadata": {"customer": "grace"}}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{outcome}");
    assert_eq!(
        (&outcome["matched"], &outcome["changed"]),
        (&json!(1), &json!(1))
    );
    let grace_id = grace["job_id"].as_str().unwrap();
    let (_, job) = api
        .call(Method::GET, &format!("/v1/jobs/{grace_id}"), None)
        .await;
    assert_eq!(job["status"], "CANCELLED");

    // Each event echoes the job's labels.
    let (_, timeline) = api
        .call(Method::GET, &format!("/v1/jobs/{grace_id}/events"), None)
        .await;
    let events = timeline["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{timeline}");
    assert!(
        events
            .iter()
            .all(|e| e["metadata"] == json!({"customer": "grace"})),
        "{timeline}"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn labels_past_their_bounds_are_refused_naming_the_field(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(
        Method::PUT,
        "/v1/workflows/approval",
        Some(crate::approval()),
    )
    .await;
    let many: serde_json::Map<String, Value> =
        (0..17).map(|n| (format!("k{n}"), json!("v"))).collect();
    for bad in [
        json!({"two words": "x"}),
        Value::Object(many),
        json!({"k": "a\u{0}b"}),
    ] {
        let (status, problem) = submit(&api, bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {problem}");
        assert_eq!(problem["field"], "metadata", "{problem}");
    }
    let (status, _) = submit(&api, json!({"k": 7})).await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a value that is no string"
    );
    let (status, problem) = api
        .call(Method::GET, "/v1/jobs?metadata=customer", None)
        .await;
    assert_eq!(
        (status, &problem["field"]),
        (StatusCode::BAD_REQUEST, &json!("metadata"))
    );
}
