//! What the web console reads and how it is served: the page and its
//! security headers, a job's timeline, a workflow's versions, listing by
//! time, the fleet view, and cross-site changes refused.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use super::{Api, MIGRATOR, TOKEN, approval};

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_console_is_served_without_a_token_under_a_strict_policy(pool: PgPool) {
    let api = Api::start(&pool).await;
    for (path, kind) in [
        ("/ui", "text/html"),
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let response = api
            .client
            .get(format!("{}{path}", api.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers();
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind));
        let policy = headers["content-security-policy"].to_str().unwrap();
        assert!(policy.contains("script-src 'self';"), "{policy}");
        assert!(!policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"));
        assert!(policy.contains("frame-ancestors 'none'"));
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let body = response.text().await.unwrap();
        assert!(!body.contains(TOKEN), "no secret in {path}");
        if kind == "text/html" {
            assert!(
                body.contains("src=\"/ui/app.js\""),
                "the page loads its script"
            );
            assert!(!body.contains("<script>"), "no inline script");
        }
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_jobs_timeline_lists_its_events_in_sequence_with_their_publication(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let job_id = Uuid::new_v4();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let response = api
        .client
        .post(format!("{}/v1/jobs", api.base))
        .bearer_auth(TOKEN)
        .header("traceparent", traceparent)
        .json(&json!({"workflow_name": "approval", "input": {"amount": 1}, "job_id": job_id}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let job: Value = response.json().await.unwrap();
    assert_eq!(job["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    let (status, _) = api
        .call(
            Method::POST,
            &format!("/v1/jobs/{job_id}/cancel"),
            Some(json!({"reason": "not needed"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    let (status, timeline) = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}/events"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let events = timeline["events"].as_array().unwrap();
    let kinds: Vec<(i64, &str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["sequence"].as_i64().unwrap(),
                e["event_type"].as_str().unwrap(),
                e["publication"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [(1, "ACCEPTED", "PENDING"), (2, "CANCELLED", "PENDING")]
    );
    assert!(events[0]["occurred_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(events[1]["error"], "not needed");

    // A row another version wrote, its payload not this version's event:
    // the timeline still shows it, from the row's own columns.
    sqlx::query(
        "UPDATE workflow_run_outbox SET payload = '{\"nonsense\": true}', body = NULL
         WHERE job_id = $1 AND sequence = 2",
    )
    .bind(job_id)
    .execute(&pool)
    .await
    .unwrap();
    let (status, timeline) = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}/events"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let foreign = &timeline["events"][1];
    assert_eq!(
        (foreign["sequence"].as_i64(), foreign["event_type"].as_str()),
        (Some(2), Some("CANCELLED"))
    );
    assert!(
        foreign["occurred_at"].is_string() && foreign["error"].is_null(),
        "{foreign}"
    );

    let unknown = Uuid::new_v4();
    let (status, problem) = api
        .call(Method::GET, &format!("/v1/jobs/{unknown}/events"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{problem}");
    let (status, _) = api.call(Method::GET, "/v1/jobs/nope/events", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn every_version_of_a_workflow_is_listed_newest_first(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let mut second = approval();
    second["max_attempts"] = json!(5);
    let (status, _) = api
        .call(Method::PUT, "/v1/workflows/approval", Some(second))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, listed) = api
        .call(Method::GET, "/v1/workflows/approval/versions", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let versions: Vec<(i64, Value)> = listed["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["version"].as_i64().unwrap(),
                v["definition"]["max_attempts"].clone(),
            )
        })
        .collect();
    assert_eq!(versions, [(2, json!(5)), (1, Value::Null)]);
    let (status, _) = api
        .call(Method::GET, "/v1/workflows/ghost/versions", None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn listing_filters_by_creation_time(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let submit = |n: i64| {
        api.call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "approval", "input": {"amount": n}})),
        )
    };
    submit(1).await;
    submit(2).await;
    // Age the first two by an hour; the third is new.
    sqlx::query("UPDATE workflow_run SET created_at = created_at - interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();
    submit(3).await;
    let cutoff = (chrono::Utc::now() - chrono::Duration::minutes(30)).to_rfc3339();
    let cutoff = urlencode(&cutoff);
    let amounts = |page: &Value| -> Vec<i64> {
        page["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["input"]["amount"].as_i64().unwrap())
            .collect()
    };
    let (status, after) = api
        .call(
            Method::GET,
            &format!("/v1/jobs?created_after={cutoff}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(amounts(&after), [3]);
    let (_, before) = api
        .call(
            Method::GET,
            &format!("/v1/jobs?created_before={cutoff}"),
            None,
        )
        .await;
    assert_eq!(amounts(&before), [2, 1]);
    let (status, problem) = api
        .call(Method::GET, "/v1/jobs?created_after=yesterday", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("created_after")
    );
}

fn urlencode(text: &str) -> String {
    text.replace('+', "%2B").replace(':', "%3A")
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_fleet_view_shows_workers_backlog_dead_letters_and_finishes(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    for n in 0..3 {
        let (_, job) = api
            .call(
                Method::POST,
                "/v1/jobs",
                Some(json!({"workflow_name": "approval", "input": {"amount": n}})),
            )
            .await;
        if n == 0 {
            let id = job["job_id"].as_str().unwrap();
            api.call(Method::POST, &format!("/v1/jobs/{id}/cancel"), None)
                .await;
        }
    }
    api.engine
        .tally_dead_letters(&["oversize", "conflict", "oversize"])
        .await
        .unwrap();
    // The sweeper announces the worker on its first tick.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let fleet = loop {
        let (status, fleet) = api.call(Method::GET, "/v1/fleet", None).await;
        assert_eq!(status, StatusCode::OK, "{fleet}");
        if !fleet["workers"].as_array().unwrap().is_empty() {
            break fleet;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no worker announced: {fleet}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(fleet["workers"][0]["worker_id"], "test-worker");
    assert_eq!(fleet["workers"][0]["claim_loops"], 0);
    assert_eq!(
        fleet["outbox"]["pending"], 4,
        "three ACCEPTED and one CANCELLED"
    );
    assert!(fleet["outbox"]["oldest_pending_at"].is_string());
    assert_eq!(
        fleet["dead_letters"],
        json!([
            {"reason": "oversize", "count": 2, "last_at": fleet["dead_letters"][0]["last_at"]},
            {"reason": "conflict", "count": 1, "last_at": fleet["dead_letters"][1]["last_at"]},
        ])
    );
    let finished = fleet["finished_per_minute"].as_array().unwrap();
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert_eq!(
        (
            finished[0]["status"].as_str(),
            finished[0]["count"].as_i64()
        ),
        (Some("CANCELLED"), Some(1))
    );
    assert!(
        fleet["consumer_lag"]["error"].is_string(),
        "this worker consumes nothing"
    );
    assert_eq!(fleet["relays"], json!([]));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn changes_from_another_site_are_refused(pool: PgPool) {
    let api = Api::start(&pool).await;
    let put = |origin: Option<&'static str>| {
        let mut request = api
            .client
            .put(format!("{}/v1/workflows/approval", api.base))
            .bearer_auth(TOKEN)
            .json(&approval());
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    let refused = put(Some("https://evil.example")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let (status, listed) = api.call(Method::GET, "/v1/workflows", None).await;
    assert_eq!(
        (status, listed["workflows"].as_array().unwrap().len()),
        (StatusCode::OK, 0),
        "nothing stored"
    );
    let same_origin = api.base.clone();
    let accepted = api
        .client
        .put(format!("{}/v1/workflows/approval", api.base))
        .bearer_auth(TOKEN)
        .header("origin", same_origin)
        .json(&approval())
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), StatusCode::CREATED);
    assert_eq!(
        put(None).await.unwrap().status(),
        StatusCode::OK,
        "not a browser"
    );
}
