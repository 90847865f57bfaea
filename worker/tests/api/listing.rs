//! Listing: newest first, filters, cursor paging, the limit clamp.

use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::PgPool;

use super::{Api, MIGRATOR, approval};

#[sqlx::test(migrator = "MIGRATOR")]
async fn listing_pages_newest_first_with_filters_and_clamps_the_limit(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let mut other = approval();
    other["name"] = json!("other");
    api.call(Method::PUT, "/v1/workflows/other", Some(other))
        .await;
    for n in 0..120 {
        let name = if n % 3 == 0 { "other" } else { "approval" };
        api.call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": name, "input": {"amount": n}})),
        )
        .await;
    }
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let (status, page) = api
            .call(
                Method::GET,
                &format!("/v1/jobs?workflow_name=approval&status=QUEUED&limit=25&cursor={cursor}"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        seen.extend(page["jobs"].as_array().unwrap().iter().map(|j| {
            (
                j["created_at"].as_str().unwrap().to_owned(),
                j["workflow_name"].clone(),
            )
        }));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(seen.len(), 80);
    assert!(seen.iter().all(|(_, w)| w == "approval"));
    assert!(seen.windows(2).all(|w| w[0].0 >= w[1].0), "newest first");
    let (_, page) = api.call(Method::GET, "/v1/jobs?limit=0", None).await;
    assert_eq!(
        page["jobs"].as_array().unwrap().len(),
        50,
        "limit 0 means 50"
    );
    // Past 500 rows, a limit of 600 is clamped to 500, not refused.
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest, status, max_attempts)
         SELECT gen_random_uuid(), 'bulk', '{}', '{}', 'd', 'FAILED', 1 FROM generate_series(1, 400)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (status, page) = api.call(Method::GET, "/v1/jobs?limit=600", None).await;
    assert_eq!(
        (status, page["jobs"].as_array().unwrap().len()),
        (StatusCode::OK, 500),
        "above 500 is clamped, not refused"
    );
    assert!(
        page["next_cursor"].is_string(),
        "520 jobs: a second page follows"
    );
    assert_eq!(
        api.call(Method::GET, "/v1/jobs?status=PAUSED", None)
            .await
            .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        api.call(Method::GET, "/v1/jobs?cursor=garbage", None)
            .await
            .0,
        StatusCode::BAD_REQUEST
    );
}
