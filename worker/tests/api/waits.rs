//! Long polls: `Prefer: wait` on a submission and `?wait=` on a job's view
//! are answered by the commit that finishes the job, and bounded.

use std::time::{Duration, Instant};

use flotilla_worker::engine::Outcome;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::{Api, MIGRATOR, TOKEN};

const DEADLINE: Duration = Duration::from_secs(20);

async fn register_quick(api: &Api) {
    let quick = json!({
        "name": "quick", "input_schema": {},
        "steps": [{"name": "only", "target": "echo", "method": "go"}]
    });
    let (status, _) = api
        .call(Method::PUT, "/v1/workflows/quick", Some(quick))
        .await;
    assert_eq!(status, StatusCode::CREATED);
}

/// Once `waiting` holds its wait, runs the job to its end: what `waiting`
/// answered, and when the job finished.
async fn finish_while_waiting<T>(api: &Api, waiting: tokio::task::JoinHandle<T>) -> (T, Instant) {
    until_waits_held(api, 1).await;
    let outcome = api.engine.run_once().await.unwrap();
    assert!(matches!(outcome, Outcome::Completed(_)), "{outcome:?}");
    let finished = Instant::now();
    let answer = tokio::time::timeout(DEADLINE, waiting)
        .await
        .unwrap()
        .unwrap();
    (answer, finished)
}

/// Registers `quick` and submits a job of it: its id.
async fn queued_quick_job(api: &Api) -> String {
    register_quick(api).await;
    let (status, job) = api
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "quick"})),
        )
        .await;
    assert_eq!(
        (status, job["status"].as_str()),
        (StatusCode::CREATED, Some("QUEUED"))
    );
    job["job_id"].as_str().unwrap().to_owned()
}

/// Until `api`'s process holds `count` waits.
async fn until_waits_held(api: &Api, count: usize) {
    let deadline = Instant::now() + DEADLINE;
    while api.engine.waits_held() != count {
        assert!(
            Instant::now() < deadline,
            "{} waits held, not {count}",
            api.engine.waits_held()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn submit_request(api: &Api, body: &Value, prefer: Option<&str>) -> reqwest::RequestBuilder {
    let mut request = api
        .client
        .post(format!("{}/v1/jobs", api.base))
        .bearer_auth(TOKEN)
        .json(body);
    if let Some(prefer) = prefer {
        request = request.header("prefer", prefer);
    }
    request
}

/// A wait on a queued job answers the moment a worker finishes it: well
/// inside the fallback check's second, so the commit's ring woke it.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_wait_on_a_job_is_answered_by_the_commit_that_finishes_it(pool: PgPool) {
    let api = Api::start(&pool).await;
    let id = queued_quick_job(&api).await;

    let waiting = tokio::spawn({
        let (client, url) = (
            api.client.clone(),
            format!("{}/v1/jobs/{id}?wait=20s", api.base),
        );
        async move {
            let response = client.get(url).bearer_auth(TOKEN).send().await.unwrap();
            let answered = Instant::now();
            (
                response.status(),
                response.json::<Value>().await.unwrap(),
                answered,
            )
        }
    });
    let ((status, view, answered), finished) = finish_while_waiting(&api, waiting).await;
    assert_eq!(
        (status, view["status"].as_str()),
        (StatusCode::OK, Some("COMPLETED")),
        "{view}"
    );
    let after = answered.saturating_duration_since(finished);
    assert!(
        after < flotilla_worker::engine::ops::awaiting::FALLBACK * 9 / 10,
        "answered {after:?} after the finish: not by the commit's ring"
    );
    until_waits_held(&api, 0).await;
}

/// `Prefer: wait=N`: 200 with the finished job when it finishes in time;
/// today's 201 with the job as it is when it does not; a finished repeat
/// at once; a malformed preference ignored, as RFC 7240 asks.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_submission_preferring_to_wait_gets_the_finished_job_or_todays_answer(pool: PgPool) {
    let api = Api::start(&pool).await;
    register_quick(&api).await;
    let body = json!({"workflow_name": "quick", "job_id": uuid::Uuid::new_v4()});
    let waiting = tokio::spawn({
        let request = submit_request(&api, &body, Some("wait=20"));
        async move {
            let response = request.send().await.unwrap();
            let applied = response.headers().get("preference-applied").cloned();
            (
                response.status(),
                applied,
                response.json::<Value>().await.unwrap(),
            )
        }
    });
    let ((status, applied, view), _) = finish_while_waiting(&api, waiting).await;
    assert_eq!(
        (status, view["status"].as_str()),
        (StatusCode::OK, Some("COMPLETED")),
        "{view}"
    );
    assert_eq!(applied.unwrap(), "wait=20");

    // The same request again: the finished job, at once.
    let started = Instant::now();
    let repeat = submit_request(&api, &body, Some("wait=20"))
        .send()
        .await
        .unwrap();
    assert_eq!(repeat.status(), StatusCode::OK);
    assert_eq!(repeat.json::<Value>().await.unwrap()["status"], "COMPLETED");
    assert!(started.elapsed() < Duration::from_secs(5));

    // Nobody runs this one: after its second, today's answer.
    let started = Instant::now();
    let late = submit_request(
        &api,
        &json!({"workflow_name": "quick"}),
        Some("respond-async, wait=1"),
    )
    .send()
    .await
    .unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(late.status(), StatusCode::CREATED);
    assert_eq!(late.headers()["preference-applied"], "wait=1");
    assert_eq!(late.json::<Value>().await.unwrap()["status"], "QUEUED");

    let ignored = submit_request(&api, &json!({"workflow_name": "quick"}), Some("wait=soon"))
        .send()
        .await
        .unwrap();
    assert_eq!(ignored.status(), StatusCode::CREATED);
    assert!(ignored.headers().get("preference-applied").is_none());
    until_waits_held(&api, 0).await;
}

/// A malformed wait is a 400 naming the field; an unknown job a 404; a
/// wait longer than the request may take ends in an answer before the
/// request's timeout, not in its 503; a caller that hangs up gives its
/// wait back (at the latest when its time is up).
#[sqlx::test(migrator = "MIGRATOR")]
async fn waits_are_checked_bounded_by_the_request_timeout_and_given_back(pool: PgPool) {
    let api = Api::start_with(
        &pool,
        &["--http-request-timeout", "2s"],
        flotilla_worker::test_support::echo_targets(),
    )
    .await;
    let id = queued_quick_job(&api).await;

    let (status, problem) = api
        .call(Method::GET, &format!("/v1/jobs/{id}?wait=soon"), None)
        .await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("wait")),
        "{problem}"
    );
    let unknown = uuid::Uuid::new_v4();
    let (status, _) = api
        .call(Method::GET, &format!("/v1/jobs/{unknown}?wait=1s"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let started = Instant::now();
    let (status, view) = api
        .call(Method::GET, &format!("/v1/jobs/{id}?wait=1h"), None)
        .await;
    assert_eq!(
        (status, view["status"].as_str()),
        (StatusCode::OK, Some("QUEUED")),
        "{view}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    let hung_up = api
        .client
        .get(format!("{}/v1/jobs/{id}?wait=20s", api.base))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(hung_up.is_err(), "{hung_up:?}");
    until_waits_held(&api, 0).await;
}
