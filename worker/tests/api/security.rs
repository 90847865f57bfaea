//! What a token holder can make the fleet do, tried from outside: scoped
//! tokens, hostile methods, a CEL bomb, a server that bounds its clients,
//! and a worker without auth that answers only the hosts it serves.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flotilla_worker::targets::http::HttpTarget;
use flotilla_worker::test_support::{TEST_TOKEN, TestApp, echo_targets};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use super::{Api, MIGRATOR, approval};

/// `method path` with `token`, the answer's status and body.
async fn as_token(
    api: &Api,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = api
        .client
        .request(method, format!("{}{path}", api.base))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    (
        response.status(),
        response.json().await.unwrap_or(Value::Null),
    )
}

fn inline(name: &str) -> Value {
    json!({
        "workflow": {"name": name, "input_schema": {},
            "steps": [{"name": "s", "target": "echo", "method": "m"}]},
        "input": {}
    })
}

async fn rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM workflow_run")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_read_only_token_is_refused_a_submission_and_a_definition(pool: PgPool) {
    let tokens = "s3cret, reader:read, ci:read+submit";
    let api = Api::start_with(&pool, &["--api-tokens", tokens], echo_targets()).await;
    assert_eq!(
        api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
            .await
            .0,
        StatusCode::CREATED
    );
    let stored = json!({"workflow_name": "approval", "input": {"amount": 1}});

    let (status, me) = as_token(&api, "reader", Method::GET, "/v1/me", None).await;
    assert_eq!((status, &me["scopes"]), (StatusCode::OK, &json!(["read"])));
    let refused = [
        (Method::POST, "/v1/jobs", Some(stored.clone()), "submit"),
        (
            Method::PUT,
            "/v1/workflows/approval",
            Some(approval()),
            "define",
        ),
    ];
    for (method, path, body, scope) in refused {
        let (status, problem) = as_token(&api, "reader", method.clone(), path, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {problem}");
        assert_eq!(problem["missing_scope"], scope, "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(scope),
            "{problem}"
        );
    }
    let (status, _) = as_token(&api, "reader", Method::GET, "/v1/jobs", None).await;
    assert_eq!(status, StatusCode::OK, "reading is what it may do");
    assert_eq!(rows(&pool).await, 0, "a refused call wrote nothing");

    // Submitting a stored workflow is not defining one: an inline
    // definition needs `define` too.
    let (status, job) = as_token(&api, "ci", Method::POST, "/v1/jobs", Some(stored)).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let (status, problem) = as_token(&api, "ci", Method::POST, "/v1/jobs", Some(inline("x"))).await;
    assert_eq!(
        (status, &problem["missing_scope"]),
        (StatusCode::FORBIDDEN, &json!("define"))
    );
    let job_id = job["job_id"].as_str().unwrap();
    for (path, scope) in [
        (format!("/v1/jobs/{job_id}/cancel"), "operate"),
        (format!("/v1/jobs/{job_id}/retry"), "operate"),
        (
            format!("/v1/jobs/{job_id}/steps/approve/complete"),
            "answer",
        ),
    ] {
        let (status, problem) = as_token(
            &api,
            "ci",
            Method::POST,
            &path,
            Some(json!({"response": {}})),
        )
        .await;
        assert_eq!(
            (status, &problem["missing_scope"]),
            (StatusCode::FORBIDDEN, &json!(scope)),
            "{path}"
        );
    }
    assert_eq!(rows(&pool).await, 1);
    // A token with no list has every scope.
    let (_, me) = as_token(&api, "s3cret", Method::GET, "/v1/me", None).await;
    assert_eq!(
        me["scopes"],
        json!(["read", "submit", "answer", "operate", "define"])
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn inline_definitions_switched_off_are_refused_to_every_token(pool: PgPool) {
    let api = Api::start_with(&pool, &["--inline-definitions", "false"], echo_targets()).await;
    let (status, problem) = api.call(Method::POST, "/v1/jobs", Some(inline("x"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("FLOTILLA_INLINE_DEFINITIONS"),
        "{problem}"
    );
    assert_eq!(rows(&pool).await, 0);
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let stored = json!({"workflow_name": "approval", "input": {"amount": 1}});
    assert_eq!(
        api.call(Method::POST, "/v1/jobs", Some(stored)).await.0,
        StatusCode::CREATED
    );
}

/// A target server that counts every request it gets, whatever the path.
async fn counting_server() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = axum::Router::new().fallback(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async { axum::Json(json!({})) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, hits)
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn hostile_methods_and_paths_are_refused_at_registration_and_never_reach_the_target(
    pool: PgPool,
) {
    let (url, hits) = counting_server().await;
    let mut targets = echo_targets();
    let crm = HttpTarget::new(&url, Duration::from_secs(5), 1024).unwrap();
    targets.register("crm", Arc::new(crm), 4);
    // Claim loops run: an accepted hostile job would reach the target.
    let api = Api::start_with(&pool, &["--worker-count", "2"], targets).await;
    // Methods, and paths (`path` stands for the method): each refused
    // when it is registered, naming its field.
    let methods = [
        "../admin",
        "%2e%2e/admin",
        "a/../../admin",
        "x?y",
        "x#y",
        "/admin",
    ]
    .map(|method| ("method", json!({"method": method})));
    let paths = [
        "/../admin",
        "/a/%2e%2e/admin",
        "//evil.example/x",
        "http://evil.example/x",
        "/a?admin=1",
        "/a#x",
        "/a/./b",
        "/{secrets.key}",
    ]
    .map(|path| ("path", json!({"verb": "GET", "path": path})));
    for (field, shape) in methods.into_iter().chain(paths) {
        let mut step = json!({"name": "s", "target": "crm"});
        step.as_object_mut()
            .unwrap()
            .extend(shape.as_object().unwrap().clone());
        let method = &shape;
        let definition = json!({"name": "hostile", "input_schema": {}, "steps": [step]});
        let (status, problem) = api
            .call(
                Method::PUT,
                "/v1/workflows/hostile",
                Some(definition.clone()),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{method}: {problem}"
        );
        assert_eq!(problem["problems"][0]["field"], field, "{problem}");
        let (status, problem) = api
            .call(
                Method::POST,
                "/v1/jobs",
                Some(json!({"workflow": definition, "input": {}})),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{method}: {problem}"
        );
    }
    // A plain method goes where it should, under the base path: the same
    // target is reachable, so the count above means something.
    let fine = json!({"workflow": {"name": "fine", "input_schema": {},
        "steps": [{"name": "s", "target": "crm", "method": "charge"}]}, "input": {}});
    let (status, job) = api.call(Method::POST, "/v1/jobs", Some(fine)).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let job = wait_final(&api, job["job_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "COMPLETED", "{job}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "only the plain call arrived"
    );
}

/// Polls the job until it is final.
async fn wait_final(api: &Api, job_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, job) = api
            .call(Method::GET, &format!("/v1/jobs/{job_id}"), None)
            .await;
        if ["COMPLETED", "FAILED", "DEAD", "CANCELLED"].contains(&job["status"].as_str().unwrap()) {
            return job;
        }
        assert!(Instant::now() < deadline, "job never finished: {job}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A rule that would build 8 million values runs out of its time on a
/// blocking thread: the job fails with its own verdict naming the budget,
/// while another job on the same worker completes and `/healthz` answers
/// quickly throughout.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_cel_bomb_fails_its_own_job_within_its_budget_while_another_completes(pool: PgPool) {
    let flags = [
        "--worker-count",
        "2",
        "--expression-max-steps",
        "1000000000000",
        "--expression-timeout",
        "2s",
    ];
    let app = TestApp::spawn_with(pool.clone(), &flags, echo_targets()).await;
    let client = flotilla_runtime::tls::http_client().build().unwrap();
    let submit = |body: Value| {
        let (client, url) = (client.clone(), app.url.clone());
        async move {
            let response = client
                .post(format!("{url}/v1/jobs"))
                .bearer_auth(TEST_TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::CREATED);
            let job: Value = response.json().await.unwrap();
            job["job_id"].as_str().unwrap().parse::<Uuid>().unwrap()
        }
    };
    let status = |job_id: Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (String, i32, Option<String>)>(
                "SELECT status::text, attempt, error FROM workflow_run WHERE job_id = $1",
            )
            .bind(job_id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let list: Vec<i64> = (0..200).collect();
    let bomb = submit(json!({
        "workflow": {"name": "bomb", "input_schema": {}, "steps": [{"name": "s",
            "target": "echo", "method": "m",
            "rules": ["x = input.l.map(a, input.l.map(b, input.l.map(c, a)))"]}]},
        "input": {"l": list}
    }))
    .await;
    // The bomb is being evaluated before the other job is submitted.
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(bomb).await.0 != "RUNNING" {
        assert!(Instant::now() < deadline, "the bomb was never claimed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fine = submit(json!({
        "workflow": {"name": "fine", "input_schema": {}, "steps": [{"name": "s",
            "target": "echo", "method": "m", "rules": ["n = input.n + 1"]}]},
        "input": {"n": 1}
    }))
    .await;
    let (mut slowest, mut fine_done_while_bomb_ran) = (Duration::ZERO, false);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let asked = Instant::now();
        let health = client
            .get(format!("{}/healthz", app.url))
            .send()
            .await
            .unwrap();
        slowest = slowest.max(asked.elapsed());
        assert_eq!(health.status(), StatusCode::OK);
        let (bomb_status, attempt, error) = status(bomb).await;
        if status(fine).await.0 == "COMPLETED" && bomb_status == "RUNNING" {
            fine_done_while_bomb_ran = true;
        }
        if bomb_status != "RUNNING" && bomb_status != "QUEUED" {
            assert_eq!((bomb_status.as_str(), attempt), ("FAILED", 1), "{error:?}");
            let error = error.unwrap();
            assert!(
                error.contains("expression budget is exhausted") && error.contains("2000 ms"),
                "{error}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the bomb never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        fine_done_while_bomb_ran,
        "the other job waited for the bomb"
    );
    assert!(
        slowest < Duration::from_millis(100),
        "/healthz took {slowest:?} while the bomb ran"
    );
    app.stop().await;
}

/// With the default budget, a rule nesting two comprehensions over 1,000
/// items runs out of iterations: the job FAILS on its first attempt with
/// its own verdict, never a retry or a lease loss.
#[sqlx::test(migrator = "MIGRATOR")]
async fn an_exhausted_budget_is_the_jobs_own_verdict(pool: PgPool) {
    let api = Api::start_with(&pool, &["--worker-count", "1"], echo_targets()).await;
    let list: Vec<i64> = (0..1000).collect();
    let job = json!({
        "workflow": {"name": "square", "input_schema": {}, "steps": [{"name": "s",
            "target": "echo", "method": "m",
            "rules": ["x = input.l.map(a, input.l.map(b, a))"]}]},
        "input": {"l": list}
    });
    let (status, created) = api.call(Method::POST, "/v1/jobs", Some(job)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let done = wait_final(&api, created["job_id"].as_str().unwrap()).await;
    assert_eq!(
        (&done["status"], &done["attempt"]),
        (&json!("FAILED"), &json!(1)),
        "{done}"
    );
    let verdict = done["verdict"].as_str().unwrap_or_default();
    assert!(verdict.contains("more than 100000 iterations"), "{done}");
}

/// A client that never finishes its headers (slowloris) is cut off after
/// the header timeout, and its seat is free again.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_client_that_never_finishes_its_headers_is_cut_off(pool: PgPool) {
    let flags = [
        "--http-header-read-timeout",
        "300ms",
        "--http-max-connections",
        "2",
    ];
    let api = Api::start_with(&pool, &flags, echo_targets()).await;
    let address = api.base.trim_start_matches("http://").to_owned();
    // Two connections that never finish their headers hold both seats.
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHo")
            .await
            .unwrap();
        slow.push(stream);
    }
    // The server closes each once the timeout passes (a read of 0 bytes,
    // an error or a 408 is the close).
    for mut stream in slow {
        let mut buffer = [0u8; 1024];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("a slow client was never cut off");
        assert!(
            read.map_or(true, |n| n == 0 || buffer[..n].starts_with(b"HTTP/1.1 408")),
            "the slow client got an answer"
        );
    }
    // The seats are free again: a normal request is served.
    let health = api
        .client
        .get(format!("{}/healthz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
}

/// Past the connection limit the server stops accepting (the kernel's
/// backlog holds the rest) until a connection closes; the probes, on a
/// listener of their own, answer meanwhile.
#[sqlx::test(migrator = "MIGRATOR")]
async fn past_the_connection_limit_the_server_waits_for_a_seat(pool: PgPool) {
    let flags = [
        "--http-max-connections",
        "1",
        "--health-addr",
        "127.0.0.1:0",
    ];
    let api = Api::start_with(&pool, &flags, echo_targets()).await;
    let address = api.base.trim_start_matches("http://").to_owned();
    let seated = tokio::net::TcpStream::connect(&address).await.unwrap();
    let waiting = tokio::spawn({
        // No pooled connection of an earlier request may hold the seat.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let base = api.base.clone();
        async move { client.get(format!("{base}/healthz")).send().await }
    });
    // Time in which a served connection would have answered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The probes do not queue behind the API's clients.
    let health = api.health.clone().expect("a health listener");
    for route in ["/healthz", "/readyz", "/metrics"] {
        let probe = tokio::time::timeout(
            Duration::from_secs(5),
            api.client.get(format!("{health}{route}")).send(),
        )
        .await
        .expect("a probe waited behind the API's clients")
        .unwrap();
        assert_eq!(probe.status(), StatusCode::OK, "{route}");
    }
    let elsewhere = api
        .client
        .get(format!("{health}/v1/jobs"))
        .bearer_auth(super::TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.status(), StatusCode::NOT_FOUND, "only the probes");
    assert!(
        !waiting.is_finished(),
        "a connection past the limit was served"
    );
    drop(seated);
    let served = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting request was never served")
        .unwrap()
        .unwrap();
    assert_eq!(served.status(), StatusCode::OK);
}

/// Without auth (a bench, a laptop), `/v1` answers only requests whose
/// `Host` is an address, `localhost` or a name listed: a page whose name
/// an attacker pointed at this worker (DNS rebinding) is refused.
#[sqlx::test(migrator = "MIGRATOR")]
async fn without_auth_only_the_hosts_the_worker_serves_are_answered(pool: PgPool) {
    let flags = [
        "--api-tokens",
        "",
        "--insecure-no-auth",
        "--http-allowed-hosts",
        "flotilla.internal",
    ];
    let api = Api::start_with(&pool, &flags, echo_targets()).await;
    let port = api.base.rsplit(':').next().unwrap().to_owned();
    let ask = |host: String| {
        let (client, base) = (api.client.clone(), api.base.clone());
        async move {
            client
                .get(format!("{base}/v1/jobs"))
                .header("Host", host)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    for served in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "flotilla.internal".to_owned(),
    ] {
        assert_eq!(ask(served.clone()).await, StatusCode::OK, "{served}");
    }
    for rebound in [
        format!("evil.example:{port}"),
        "127.0.0.1.nip.io".to_owned(),
    ] {
        assert_eq!(
            ask(rebound.clone()).await,
            StatusCode::FORBIDDEN,
            "{rebound}"
        );
    }
    // Without auth the token's description says so.
    let me: Value = api
        .client
        .get(format!("{}/v1/me", api.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(me["auth"], false, "{me}");
}

#[test]
fn without_auth_the_default_address_is_this_machine_only() {
    use clap::Parser;
    use flotilla_worker::config::Cli;

    let parse = |args: &[&str]| {
        let base = ["flotilla-worker", "--database-url", "postgres://unused"];
        let cli = Cli::try_parse_from(base.iter().chain(args)).unwrap();
        cli.worker.http.listen_addr().to_string()
    };
    assert_eq!(parse(&["--insecure-no-auth"]), "127.0.0.1:8080");
    assert_eq!(parse(&[]), "0.0.0.0:8080");
    // An address given is an address meant.
    assert_eq!(
        parse(&["--insecure-no-auth", "--http-addr", "0.0.0.0:9000"]),
        "0.0.0.0:9000"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn workflow_versions_are_listed_a_page_at_a_time(pool: PgPool) {
    let api = Api::start(&pool).await;
    for amount_type in ["integer", "number", "string"] {
        let mut definition = approval();
        definition["input_schema"]["properties"]["amount"]["type"] = json!(amount_type);
        api.call(Method::PUT, "/v1/workflows/approval", Some(definition))
            .await;
    }
    let (status, page) = api
        .call(Method::GET, "/v1/workflows/approval/versions?limit=2", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let versions: Vec<i64> = page["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_i64().unwrap())
        .collect();
    assert_eq!((versions, &page["next_before"]), (vec![3, 2], &json!(2)));
    let (_, last) = api
        .call(
            Method::GET,
            "/v1/workflows/approval/versions?limit=2&before=2",
            None,
        )
        .await;
    assert_eq!(last["versions"][0]["version"], 1);
    assert_eq!(last["next_before"], Value::Null);
}

/// The CEL parser and evaluator recurse with large frames: an expression
/// nested a few dozen levels would overflow a default thread's stack and
/// abort the whole worker. Too deep is refused before parsing; as deep as
/// allowed runs on threads with room for it.
#[sqlx::test(migrator = "MIGRATOR")]
async fn deeply_nested_expressions_never_crash_the_worker(pool: PgPool) {
    let api = Api::start_with(&pool, &["--worker-count", "1"], echo_targets()).await;
    let job = |rule: String| {
        json!({"workflow": {"name": "deep", "input_schema": {},
            "steps": [{"name": "s", "target": "echo", "method": "m", "rules": [rule]}]},
            "input": {}})
    };
    let too_deep = format!("x = {}1{}", "[".repeat(40), "]".repeat(40));
    let (status, problem) = api
        .call(Method::POST, "/v1/jobs", Some(job(too_deep)))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("nested"),
        "{problem}"
    );
    // 31 additions: as deep as allowed, and deeper than a default stack
    // holds once instrumented.
    let deepest = format!("x = {}", vec!["1"; 31].join(" + "));
    let (status, created) = api.call(Method::POST, "/v1/jobs", Some(job(deepest))).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let done = wait_final(&api, created["job_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["result"]["echo"]["x"], 31, "{done}");
}

/// Versions are never deleted (jobs point at them): a client registering
/// in a loop stops at the cap of one name.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_name_holds_at_most_its_cap_of_versions(pool: PgPool) {
    let api = Api::start(&pool).await;
    sqlx::query(
        "INSERT INTO workflow_definition (name, version, definition)
         SELECT 'approval', v, jsonb_build_object('v', v) FROM generate_series(1, 1000) AS v",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (status, problem) = api
        .call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("1000 versions"),
        "{problem}"
    );
    // Another name is still free.
    let mut other = approval();
    other["name"] = json!("approval2");
    assert_eq!(
        api.call(Method::PUT, "/v1/workflows/approval2", Some(other))
            .await
            .0,
        StatusCode::CREATED
    );
}
