//! The HTTP API over real HTTP on port 0 against a real Postgres.

use std::sync::Arc;

use flotilla_worker::api::{self, ApiState};
use flotilla_worker::engine::{Engine, EngineSettings, SystemClock};
use flotilla_worker::target::{FnTarget, StepFailure, TargetCall, Targets};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_worker::db::MIGRATOR;
const TOKEN: &str = "s3cret";

struct Api {
    base: String,
    client: Client,
    engine: Engine,
}

impl Api {
    async fn start(pool: &PgPool) -> Self {
        let mut targets = Targets::default();
        targets.register(
            "echo",
            Arc::new(FnTarget(|call: TargetCall| async move {
                Ok::<_, StepFailure>(json!({"echo": call.request}))
            })),
            8,
        );
        let engine = Engine::new(
            pool.clone(),
            targets,
            Arc::new(SystemClock),
            EngineSettings::new("api-test"),
        );
        let state = ApiState {
            engine: engine.clone(),
            bootstrap_servers: None,
        };
        let router = api::router(state, api::tokens_from(&format!("other, {TOKEN}")), 4096);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(api::serve(
            listener,
            router,
            tokio_util::sync::CancellationToken::new(),
        ));
        Self {
            base,
            client: Client::new(),
            engine,
        }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        if !status.is_success() {
            let content_type = response.headers()["content-type"]
                .to_str()
                .unwrap()
                .to_owned();
            assert_eq!(
                content_type, "application/problem+json",
                "{status} on {path}"
            );
        }
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

fn approval() -> Value {
    json!({
        "name": "approval",
        "input_schema": {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}},
        "steps": [
            {"name": "check", "target": "echo", "method": "check", "rules": ["amount = input.amount"]},
            {"name": "approve", "target": "echo", "method": "approve", "completion": "external", "validate": ["response.ok == true"]}
        ]
    })
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn every_v1_route_requires_a_bearer_token(pool: PgPool) {
    let api = Api::start(&pool).await;
    let id = Uuid::new_v4();
    let routes = [
        (Method::POST, "/v1/jobs".to_owned()),
        (Method::GET, "/v1/jobs".to_owned()),
        (Method::GET, format!("/v1/jobs/{id}")),
        (Method::POST, format!("/v1/jobs/{id}/steps/s/complete")),
        (Method::POST, format!("/v1/jobs/{id}/retry")),
        (Method::POST, format!("/v1/jobs/{id}/cancel")),
        (Method::GET, "/v1/workflows".to_owned()),
        (Method::GET, "/v1/workflows/w".to_owned()),
        (Method::PUT, "/v1/workflows/w".to_owned()),
    ];
    for (method, path) in routes {
        let url = format!("{}{path}", api.base);
        let missing = api
            .client
            .request(method.clone(), &url)
            .send()
            .await
            .unwrap();
        assert_eq!(
            missing.status(),
            StatusCode::UNAUTHORIZED,
            "{method} {path}"
        );
        let wrong = api
            .client
            .request(method.clone(), &url)
            .bearer_auth("guess")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), StatusCode::FORBIDDEN, "{method} {path}");
    }
    let health = api
        .client
        .get(format!("{}/healthz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let ready = api
        .client
        .get(format!("{}/readyz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn submit_get_complete_retry_and_cancel_answer_with_the_contract_statuses(pool: PgPool) {
    let api = Api::start(&pool).await;
    assert_eq!(
        api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
            .await
            .0,
        StatusCode::CREATED
    );
    assert_eq!(
        api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
            .await
            .0,
        StatusCode::OK,
        "same document, same version"
    );
    let (status, problem) = api.call(Method::PUT, "/v1/workflows/approval", Some(json!({"name": "approval", "input_schema": {}, "steps": [{"name": "x", "target": "nope", "method": "m"}]}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["problems"][0]["field"], "target");
    let (status, listed) = api.call(Method::GET, "/v1/workflows", None).await;
    assert_eq!(
        (status, listed["workflows"][0]["name"].clone()),
        (StatusCode::OK, json!("approval"))
    );
    assert_eq!(
        api.call(Method::GET, "/v1/workflows/ghost", None).await.0,
        StatusCode::NOT_FOUND
    );

    let job_id = Uuid::new_v4();
    let body = json!({"workflow_name": "approval", "input": {"amount": 5}, "job_id": job_id});
    let (status, job) = api.call(Method::POST, "/v1/jobs", Some(body.clone())).await;
    assert_eq!(
        (status, job["status"].clone()),
        (StatusCode::CREATED, json!("QUEUED"))
    );
    assert_eq!(
        api.call(Method::POST, "/v1/jobs", Some(body)).await.0,
        StatusCode::OK
    );
    let conflicting =
        json!({"workflow_name": "approval", "input": {"amount": 6}, "job_id": job_id});
    assert_eq!(
        api.call(Method::POST, "/v1/jobs", Some(conflicting))
            .await
            .0,
        StatusCode::CONFLICT
    );
    let (status, problem) = api
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "approval", "workflow": approval(), "input": {}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("exactly one of")
    );
    assert_eq!(
        api.call(Method::POST, "/v1/jobs", Some(json!({"input": {}})))
            .await
            .0,
        StatusCode::BAD_REQUEST
    );
    let (status, problem) = api
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "approval", "input": {"amount": "x"}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        problem["violations"][0]
            .as_str()
            .unwrap()
            .starts_with("/amount")
    );
    assert_eq!(
        api.call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "ghost"}))
        )
        .await
        .0,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    assert_eq!(
        api.call(Method::GET, &format!("/v1/jobs/{}", Uuid::new_v4()), None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    let (status, problem) = api.call(Method::GET, "/v1/jobs/not-a-uuid", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(problem["detail"].as_str().unwrap().contains("not a UUID"));

    // Complete-step: WrongState while queued, then park, reject, complete.
    let complete = |id: Uuid, response: Value| {
        (
            Method::POST,
            format!("/v1/jobs/{id}/steps/approve/complete"),
            Some(json!({"response": response})),
        )
    };
    let (m, p, b) = complete(job_id, json!({"ok": true}));
    let (status, problem) = api.call(m, &p, b).await;
    assert_eq!(
        (status, problem["status"].clone()),
        (StatusCode::CONFLICT, json!("QUEUED"))
    );
    api.engine.run_once().await.unwrap();
    let (m, p, b) = complete(job_id, json!({"ok": true}));
    let (status, outcome) = api.call(m, &p, b).await;
    assert_eq!(
        (status, outcome["outcome"].clone()),
        (StatusCode::OK, json!("COMPLETED"))
    );
    let (m, p, b) = complete(job_id, json!({"ok": true}));
    assert_eq!(api.call(m, &p, b).await.1["outcome"], "ALREADY_DONE");

    let refused = Uuid::new_v4();
    api.call(
        Method::POST,
        "/v1/jobs",
        Some(json!({"workflow_name": "approval", "input": {"amount": 1}, "job_id": refused})),
    )
    .await;
    // Run everything runnable: the first job finishes, the new one parks.
    while api.engine.run_once().await.unwrap() != flotilla_worker::engine::Outcome::Idle {}
    let (m, p, b) = complete(refused, json!({"ok": false}));
    let (status, problem) = api.call(m, &p, b).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["violations"][0], "approve: response.ok == true");
    assert_eq!(
        api.call(Method::POST, &format!("/v1/jobs/{refused}/cancel"), None)
            .await
            .0,
        StatusCode::CONFLICT
    );
    let (status, retried) = api
        .call(Method::POST, &format!("/v1/jobs/{refused}/retry"), None)
        .await;
    assert_eq!(
        (status, retried["status"].clone()),
        (StatusCode::OK, json!("QUEUED"))
    );
    let (status, cancelled) = api
        .call(
            Method::POST,
            &format!("/v1/jobs/{refused}/cancel"),
            Some(json!({"reason": "duplicate"})),
        )
        .await;
    assert_eq!(
        (
            status,
            cancelled["status"].clone(),
            cancelled["error"].clone()
        ),
        (StatusCode::OK, json!("CANCELLED"), json!("duplicate"))
    );
}

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

    let mut documented = std::collections::BTreeSet::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            assert!(
                operation["responses"]
                    .as_object()
                    .is_some_and(|r| !r.is_empty()),
                "{method} {path} documents its responses"
            );
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    // The routes of DESIGN.md, as the router is built.
    let served: std::collections::BTreeSet<(String, String)> = [
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/{job_id}"),
        ("POST", "/v1/jobs/{job_id}/steps/{step_name}/complete"),
        ("POST", "/v1/jobs/{job_id}/retry"),
        ("POST", "/v1/jobs/{job_id}/cancel"),
        ("PUT", "/v1/workflows/{name}"),
        ("GET", "/v1/workflows"),
        ("GET", "/v1/workflows/{name}"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
    ]
    .into_iter()
    .map(|(m, p)| (m.to_owned(), p.to_owned()))
    .collect();
    assert_eq!(documented, served);

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
