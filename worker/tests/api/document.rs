//! Body limits, the 503 without a database, and the OpenAPI document.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use super::{Api, MIGRATOR, TOKEN};

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_body_over_the_limit_is_413_and_bad_json_is_400(pool: PgPool) {
    let api = Api::start(&pool).await;
    let big = json!({"workflow_name": "x", "input": {"blob": "x".repeat(5000)}});
    let (status, problem) = api.call(Method::POST, "/v1/jobs", Some(big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(problem["detail"].as_str().unwrap().contains("request body"));
    let response = api
        .client
        .post(format!("{}/v1/jobs", api.base))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
}

#[tokio::test]
async fn without_a_database_the_api_answers_503_with_the_reason() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(1))
        .connect_lazy("postgres://postgres@127.0.0.1:1/none")
        .unwrap();
    let api = Api::start(&pool).await;
    let (status, problem) = api
        .call(Method::GET, &format!("/v1/jobs/{}", Uuid::new_v4()), None)
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .starts_with("database unavailable"),
        "{problem}"
    );
    assert_eq!(
        api.call(Method::GET, "/readyz", None).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        api.call(Method::GET, "/healthz", None).await.0,
        StatusCode::OK
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_openapi_document_describes_exactly_the_routes_the_router_serves(pool: PgPool) {
    let api = Api::start(&pool).await;
    let response = api
        .client
        .get(format!("{}/openapi.json", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "/openapi.json is open");
    let document: Value = response.json().await.unwrap();
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3."),
        "OpenAPI 3"
    );
    assert!(document["info"]["title"].is_string() && document["info"]["version"].is_string());
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );

    // A definition's body is typed by the published schema of a
    // definition, so an editor or a generated client can check one.
    let definition = &document["components"]["schemas"]["WorkflowDefinition"];
    assert!(
        definition["properties"]["steps"].is_object(),
        "the definition's schema is a component: {definition}"
    );
    assert_eq!(
        document["paths"]["/v1/workflows/{name}"]["put"]["requestBody"]["content"]["application/json"]
            ["schema"]["$ref"],
        "#/components/schemas/WorkflowDefinition"
    );
    assert!(
        document["components"]["schemas"]["StepDefinition"]["properties"]["needs"].is_object(),
        "the schemas a definition refers to are components too"
    );

    let mut documented = std::collections::BTreeSet::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            assert!(
                operation["responses"]
                    .as_object()
                    .is_some_and(|r| !r.is_empty()),
                "{method} {path} documents its responses"
            );
            // Grouped by the handlers' module (`jobs`, `ops`, ...), as an
            // editor or a generated client shows them.
            assert!(
                operation["tags"].as_array().is_some_and(|tags| tags
                    .iter()
                    .any(|t| t.as_str().is_some_and(|t| !t.is_empty()))),
                "{method} {path} has a tag"
            );
            if path.starts_with("/v1/") {
                for shared in ["401", "403", "503"] {
                    assert!(
                        operation["responses"].get(shared).is_some(),
                        "{method} {path} documents the shared {shared}"
                    );
                }
            }
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    // The routes of the contract (docs/architecture.md), as the router is built.
    let served: std::collections::BTreeSet<(String, String)> = [
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/{job_id}"),
        ("GET", "/v1/jobs/{job_id}/events"),
        ("GET", "/v1/jobs/{job_id}/graph"),
        ("POST", "/v1/jobs/{job_id}/graft"),
        ("POST", "/v1/jobs/{job_id}/signals"),
        ("GET", "/v1/jobs/{job_id}/signals"),
        ("POST", "/v1/jobs/{job_id}/steps/{step_name}/complete"),
        ("POST", "/v1/jobs/{job_id}/retry"),
        ("POST", "/v1/jobs/{job_id}/cancel"),
        ("POST", "/v1/jobs/bulk/retry"),
        ("POST", "/v1/jobs/bulk/cancel"),
        ("PUT", "/v1/workflows/{name}"),
        ("GET", "/v1/workflows"),
        ("GET", "/v1/workflows/{name}"),
        ("GET", "/v1/workflows/{name}/versions"),
        ("GET", "/v1/schedules"),
        ("GET", "/v1/schedules/{name}"),
        ("PUT", "/v1/schedules/{name}"),
        ("DELETE", "/v1/schedules/{name}"),
        ("POST", "/v1/schedules/{name}/pause"),
        ("POST", "/v1/schedules/{name}/resume"),
        ("GET", "/v1/fleet"),
        ("GET", "/v1/me"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
    ]
    .into_iter()
    .map(|(m, p)| (m.to_owned(), p.to_owned()))
    .collect();
    assert_eq!(documented, served);

    // Every `/v1` route but the token's own description needs a scope.
    for (method, path) in documented
        .iter()
        .filter(|(_, path)| path.starts_with("/v1/"))
    {
        let scoped = flotilla_worker::api::ROUTE_SCOPES
            .iter()
            .any(|(m, p, _)| m == method && p == path);
        assert!(
            scoped || path == flotilla_worker::api::WHO_AM_I,
            "{method} {path} has no scope"
        );
    }

    // And every documented route is really served: no fallback 404, no 405.
    for (method, path) in &documented {
        let concrete = path
            .replace("{job_id}", &Uuid::new_v4().to_string())
            .replace("{step_name}", "s")
            .replace("{name}", "w");
        let response = api
            .client
            .request(method.parse().unwrap(), format!("{}{concrete}", api.base))
            .bearer_auth(TOKEN)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_ne!(
            body["detail"], "no such route",
            "{method} {path} is documented but not routed"
        );
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn readiness_fails_while_a_supervised_task_is_dead_and_names_it(pool: PgPool) {
    let api = Api::start(&pool).await;
    assert_eq!(
        api.call(Method::GET, "/readyz", None).await.0,
        StatusCode::OK
    );
    api.engine
        .health()
        .dead("request consumer", "panicked: boom");
    let (status, problem) = api.call(Method::GET, "/readyz", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("request consumer died: panicked: boom"),
        "{detail}"
    );
    // Without a token: only that it is not ready (the reasons can name
    // hosts and errors).
    let anonymous = api
        .client
        .get(format!("{}/readyz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::SERVICE_UNAVAILABLE);
    let problem: Value = anonymous.json().await.unwrap();
    assert_eq!(problem["detail"], "not ready", "{problem}");
    assert_eq!(
        api.call(Method::GET, "/healthz", None).await.0,
        StatusCode::OK,
        "alive, not ready"
    );
}

/// A job's checkpoints are a JSON array (the column's CHECK says so); the
/// document once called them an object, which schemathesis caught once a
/// sample workflow accepted `{}` and jobs were created during the fuzz.
#[sqlx::test(migrator = "MIGRATOR")]
async fn the_document_describes_checkpoints_as_the_array_they_are(pool: PgPool) {
    let api = Api::start(&pool).await;
    let document: Value = api
        .client
        .get(format!("{}/openapi.json", api.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let checkpoints = &document["components"]["schemas"]["JobView"]["properties"]["checkpoints"];
    assert_eq!(checkpoints["type"], "array", "{checkpoints}");
}
