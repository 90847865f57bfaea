//! Retry and cancel by filter over 1,000 jobs: a dry run that counts, the
//! action itself, jobs the action does not apply to passed over with their
//! reasons, and the refusals of a filter that cannot be meant.

use flotilla_worker::engine::{RefusalMode, Submission, WorkflowRef};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::{Api, MIGRATOR};

async fn submit(api: &Api, workflow: &str, input: Value, count: usize) {
    for _ in 0..count {
        let submission = Submission {
            metadata: None,
            priority: 0,
            job_id: Uuid::new_v4(),
            workflow: WorkflowRef::Stored(workflow.to_owned()),
            input: input.clone(),
            traceparent: None,
            tracestate: None,
        };
        api.engine
            .submit(submission, RefusalMode::Record)
            .await
            .unwrap();
    }
}

async fn count(pool: &PgPool, workflow: &str, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM workflow_run WHERE workflow_name = $1 AND status = $2")
        .bind(workflow)
        .bind(status)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_thousand_failed_jobs_are_counted_retried_and_cancelled_by_filter(pool: PgPool) {
    let api = Api::start(&pool).await;
    for name in ["strict", "other"] {
        let definition = json!({
            "name": name,
            "input_schema": {"type": "object", "required": ["order"]},
            "steps": [{"name": "only", "target": "echo", "method": "go"}]
        });
        let (status, _) = api
            .call(
                Method::PUT,
                &format!("/v1/workflows/{name}"),
                Some(definition),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    // Refused inputs become FAILED rows; good ones stay QUEUED.
    submit(&api, "strict", json!({}), 1000).await;
    submit(&api, "strict", json!({"order": 1}), 300).await;
    submit(&api, "other", json!({}), 50).await;
    assert_eq!(count(&pool, "strict", "FAILED").await, 1000);

    let failed_strict = json!({"status": "FAILED", "workflow_name": "strict"});
    let (status, dry) = api
        .call(
            Method::POST,
            "/v1/jobs/bulk/retry",
            Some(json!({"filter": failed_strict, "dry_run": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(
        (
            &dry["matched"],
            &dry["changed"],
            &dry["dry_run"],
            &dry["more"]
        ),
        (&json!(1000), &json!(0), &json!(true), &json!(false)),
        "{dry}"
    );
    assert_eq!(
        count(&pool, "strict", "FAILED").await,
        1000,
        "a dry run changes nothing"
    );

    let (status, retried) = api
        .call(
            Method::POST,
            "/v1/jobs/bulk/retry",
            Some(json!({"filter": failed_strict})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{retried}");
    assert_eq!(
        (&retried["matched"], &retried["changed"]),
        (&json!(1000), &json!(1000))
    );
    assert_eq!(count(&pool, "strict", "FAILED").await, 0);
    assert_eq!(count(&pool, "strict", "QUEUED").await, 1300);
    assert_eq!(
        count(&pool, "other", "FAILED").await,
        50,
        "another workflow's jobs stay"
    );

    let (status, cancelled) = api
        .call(
            Method::POST,
            "/v1/jobs/bulk/cancel",
            Some(json!({"filter": {"status": "QUEUED", "workflow_name": "strict"}, "reason": "bad deploy"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(
        (&cancelled["matched"], &cancelled["changed"]),
        (&json!(1300), &json!(1300))
    );
    let error: Option<String> =
        sqlx::query_scalar("SELECT error FROM workflow_run WHERE workflow_name = 'strict' LIMIT 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(error.as_deref(), Some("bad deploy"));

    // Finished jobs cannot be cancelled: each is passed over, with why.
    let (status, again) = api
        .call(
            Method::POST,
            "/v1/jobs/bulk/cancel",
            Some(json!({"filter": {"workflow_name": "strict"}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        (&again["changed"], &again["passed_over"]),
        (&json!(0), &json!(1300))
    );
    let examples = again["passed_over_examples"].as_array().unwrap();
    assert_eq!(examples.len(), 20);
    assert!(
        examples[0]["reason"]
            .as_str()
            .unwrap()
            .contains("CANCELLED"),
        "{again}"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_filter_that_cannot_be_meant_is_refused_naming_its_field(pool: PgPool) {
    let api = Api::start(&pool).await;
    let cases = [
        ("/v1/jobs/bulk/cancel", json!({"filter": {}}), "filter"),
        (
            "/v1/jobs/bulk/retry",
            json!({"filter": {"status": "SLEEPY"}}),
            "filter.status",
        ),
        (
            "/v1/jobs/bulk/retry",
            json!({"filter": {"created_after": "yesterday"}}),
            "filter.created_after",
        ),
        (
            "/v1/jobs/bulk/retry",
            json!({"filter": {"status": "DEAD"}, "reason": "x"}),
            "reason",
        ),
        (
            "/v1/jobs/bulk/cancel",
            json!({"filter": {"status": "QUEUED"}, "reason": "a\u{0}b"}),
            "reason",
        ),
    ];
    for (path, body, field) in cases {
        let (status, problem) = api.call(Method::POST, path, Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert_eq!(problem["field"], field, "{body}: {problem}");
    }
    let (status, problem) = api
        .call(
            Method::POST,
            "/v1/jobs/bulk/retry",
            Some(json!({"filter": {"status": "DEAD"}, "colour": 1})),
        )
        .await;
    // A body of another shape: 422, as every JSON body the API cannot read.
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
}
