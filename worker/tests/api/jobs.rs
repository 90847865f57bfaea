//! The job verbs answer with the contract's statuses.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use super::{Api, MIGRATOR, approval};

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
        (
            status,
            problem["job_status"].clone(),
            problem["status"].clone()
        ),
        (StatusCode::CONFLICT, json!("QUEUED"), json!(409)),
        "the problem's status stays the HTTP status"
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
async fn the_nil_job_id_and_unstorable_values_are_400_naming_the_field(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let cases = [
        (
            json!({"workflow_name": "approval", "input": {"amount": 1}, "job_id": Uuid::nil()}),
            "job_id",
        ),
        (
            json!({"workflow_name": "approval", "input": {"amount": 1, "memo": "a\u{0}b"}}),
            "input.memo",
        ),
        (
            json!({"workflow_name": "appr\u{0}oval", "input": {"amount": 1}}),
            "workflow_name",
        ),
    ];
    for (body, field) in cases {
        let (status, problem) = api.call(Method::POST, "/v1/jobs", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(problem["field"], field, "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(field),
            "{problem}"
        );
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing was written");
}

/// A cancel reason the store cannot hold (a NUL) is the caller's mistake:
/// 400 naming the field, the job untouched. (Schemathesis found it answering
/// 503 once the demo's workflows let it create jobs.)
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_cancel_reason_with_a_nul_is_400_and_the_job_stays_queued(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let job_id = Uuid::new_v4();
    let (status, _) = api
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "approval", "input": {"amount": 1}, "job_id": job_id})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, problem) = api
        .call(
            Method::POST,
            &format!("/v1/jobs/{job_id}/cancel"),
            Some(json!({"reason": "a\u{0}b"})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_eq!(problem["field"], "reason", "{problem}");
    let (_, job) = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}"), None)
        .await;
    assert_eq!(job["status"], "QUEUED");
}

/// Registration and the read filters check names as submissions do: a
/// NUL or a name over the limit is a 400 naming the field, never a 503
/// from a database that refused the text.
#[sqlx::test(migrator = "MIGRATOR")]
async fn names_the_store_cannot_hold_are_400_naming_the_field_in_registration_and_reads(
    pool: PgPool,
) {
    let api = Api::start(&pool).await;
    let long = "w".repeat(300);
    let mut nul_inside = approval();
    nul_inside["steps"][0]["rules"] = json!(["memo = 'a\u{0}b'"]);
    let mut long_named = approval();
    long_named["name"] = json!(long);
    let cases = [
        (
            Method::PUT,
            "/v1/workflows/approval".to_owned(),
            Some(nul_inside),
            "workflow",
        ),
        (
            Method::PUT,
            format!("/v1/workflows/{long}"),
            Some(long_named),
            "workflow_name",
        ),
        (
            Method::GET,
            "/v1/jobs?workflow_name=a%00b".to_owned(),
            None,
            "workflow_name",
        ),
        (
            Method::GET,
            format!("/v1/jobs?workflow_name={long}"),
            None,
            "workflow_name",
        ),
        (
            Method::GET,
            "/v1/workflows/a%00b".to_owned(),
            None,
            "workflow_name",
        ),
        (
            Method::GET,
            format!("/v1/workflows/{long}/versions"),
            None,
            "workflow_name",
        ),
    ];
    for (method, path, body, field) in cases {
        let (status, problem) = api.call(method.clone(), &path, body).await;
        let shown = &path[..path.len().min(60)];
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{method} {shown}: {problem}"
        );
        assert!(
            problem["field"]
                .as_str()
                .is_some_and(|f| f.starts_with(field)),
            "{method} {shown}: {problem}"
        );
    }
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_definition")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 0, "nothing was registered");
}

/// A job's graph names every step with its state, its edges both ways
/// and its kind: here a skipped check, a step parked for its answer, and
/// what waits behind it.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_jobs_graph_shows_each_step_with_its_state_and_its_edges(pool: PgPool) {
    let api = Api::start(&pool).await;
    let workflow = json!({
        "name": "drawn", "input_schema": {},
        "steps": [
            {"name": "fetch", "target": "echo", "method": "m", "needs": []},
            {"name": "check", "target": "echo", "method": "m", "needs": ["fetch"], "when": "false"},
            {"name": "approve", "target": "echo", "method": "m", "needs": ["fetch"], "completion": "external"},
            {"name": "ship", "target": "echo", "method": "m", "needs": ["check", "approve"]}
        ]
    });
    let (status, _) = api
        .call(Method::PUT, "/v1/workflows/drawn", Some(workflow))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, job) = api
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "drawn", "input": {}})),
        )
        .await;
    let job_id = job["job_id"].as_str().unwrap().to_owned();
    api.engine.run_once().await.unwrap();

    let (status, graph) = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}/graph"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{graph}");
    assert_eq!(graph["status"], "WAITING");
    let states: Vec<(String, String, String)> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_owned(),
                n["state"].as_str().unwrap().to_owned(),
                n["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("fetch", "completed", "call"),
        ("check", "skipped", "call"),
        ("approve", "waiting", "external"),
        ("ship", "pending", "call"),
    ];
    assert_eq!(
        states,
        expected.map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()))
    );
    assert_eq!(graph["nodes"][0]["dependants"], json!(["check", "approve"]));
    assert_eq!(graph["nodes"][3]["needs"], json!(["check", "approve"]));

    let (status, _) = api
        .call(
            Method::GET,
            &format!("/v1/jobs/{}/graph", Uuid::new_v4()),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Grafts append steps to a job that has not finished, at the revision the
/// caller saw: a stale revision and a finished job are 409, the same graft
/// again a repeat, a graft that would break the graph 422 naming the step;
/// grafted steps run when the job resumes.
#[sqlx::test(migrator = "MIGRATOR")]
async fn grafted_steps_join_a_running_graph_at_its_revision(pool: PgPool) {
    let api = Api::start(&pool).await;
    let workflow = json!({
        "name": "grafted", "input_schema": {},
        "steps": [
            {"name": "fetch", "target": "echo", "method": "m", "needs": []},
            {"name": "approve", "target": "echo", "method": "m", "needs": ["fetch"], "completion": "external"}
        ]
    });
    api.call(Method::PUT, "/v1/workflows/grafted", Some(workflow))
        .await;
    let (_, job) = api
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "grafted", "input": {}})),
        )
        .await;
    let job_id = job["job_id"].as_str().unwrap().to_owned();
    api.engine.run_once().await.unwrap();
    let path = format!("/v1/jobs/{job_id}/graft");
    let api = &api;
    let graft = |body: Value| {
        let path = path.clone();
        async move { api.call(Method::POST, &path, Some(body)).await }
    };
    let audit = json!({"name": "audit", "target": "echo", "method": "audit", "needs": ["fetch"],
        "rules": ["seen = steps.fetch.echo"]});

    let (status, stale) = graft(json!({"revision": 1, "steps": [audit.clone()]})).await;
    assert_eq!(
        (status, stale["revision"].clone()),
        (StatusCode::CONFLICT, json!(0)),
        "{stale}"
    );

    let (status, grafted) = graft(json!({"revision": 0, "steps": [audit.clone()]})).await;
    assert_eq!(status, StatusCode::OK, "{grafted}");
    assert_eq!(
        (
            grafted["repeat"].clone(),
            grafted["job"]["revision"].clone()
        ),
        (json!(false), json!(1))
    );
    let (status, again) = graft(json!({"revision": 0, "steps": [audit.clone()]})).await;
    assert_eq!(
        (status, again["repeat"].clone()),
        (StatusCode::OK, json!(true))
    );
    assert_eq!(
        again["job"]["revision"],
        json!(1),
        "a repeat writes nothing"
    );

    for (bad, step, field) in [
        (
            json!({"name": "loop", "target": "echo", "method": "m", "needs": ["loop"]}),
            "loop",
            "needs",
        ),
        (
            json!({"name": "fetch", "target": "echo", "method": "other"}),
            "fetch",
            "name",
        ),
        (
            json!({"name": "late", "target": "echo", "method": "m", "needs": ["nowhere"]}),
            "late",
            "needs",
        ),
    ] {
        let (status, refused) = graft(json!({"revision": 1, "steps": [bad]})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
        let problems = refused["problems"].as_array().unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p["step"] == step && p["field"] == field),
            "{refused}"
        );
    }
    let (status, _) = graft(json!({"revision": 1, "steps": []})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let (_, events) = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}/events"), None)
        .await;
    let verdicts: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["verdict"].as_str())
        .collect();
    assert!(verdicts.contains(&"grafted revision 1: audit"), "{events}");

    // The grafted step is ready (its need ended): the WAITING job was
    // queued again, runs it, and waits for its answer again.
    api.engine.run_once().await.unwrap();
    let (_, waiting) = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}"), None)
        .await;
    assert_eq!(waiting["status"], "WAITING", "{waiting}");
    let (status, _) = api
        .call(
            Method::POST,
            &format!("/v1/jobs/{job_id}/steps/approve/complete"),
            Some(json!({"response": {"ok": true}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    api.engine.run_once().await.unwrap();
    let (_, done) = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}"), None)
        .await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let names: Vec<&str> = done["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["fetch", "audit", "approve"]);

    let (status, finished) = graft(json!({"revision": 1, "steps": [
        {"name": "after", "target": "echo", "method": "m"}]}))
    .await;
    assert_eq!(
        (status, finished["job_status"].clone()),
        (StatusCode::CONFLICT, json!("COMPLETED"))
    );
}

/// Hostile values on the graph paths get their own 4xx and touch nothing
/// else: a graft holding a NUL is refused naming the field (the job keeps
/// its revision), and a row whose definition another version wrote in a
/// shape this one cannot read is a 422 for its graph alone.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_hostile_graft_and_an_unreadable_row_get_their_own_answers(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (_, job) = api
            .call(
                Method::POST,
                "/v1/jobs",
                Some(json!({"workflow_name": "approval", "input": {"amount": 1}})),
            )
            .await;
        ids.push(job["job_id"].as_str().unwrap().to_owned());
    }
    let (status, refused) = api
        .call(
            Method::POST,
            &format!("/v1/jobs/{}/graft", ids[0]),
            Some(json!({"revision": 0, "steps": [{"name": "a\u{0}b", "target": "echo", "method": "m"}]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(
        refused["field"]
            .as_str()
            .unwrap_or_default()
            .starts_with("steps"),
        "{refused}"
    );
    let (_, job) = api
        .call(Method::GET, &format!("/v1/jobs/{}", ids[0]), None)
        .await;
    assert_eq!(job["revision"], json!(0));

    sqlx::query(
        "UPDATE workflow_run SET definition = '{\"steps\": 7}'::jsonb WHERE job_id = $1::uuid",
    )
    .bind(&ids[0])
    .execute(&pool)
    .await
    .unwrap();
    let (status, problem) = api
        .call(Method::GET, &format!("/v1/jobs/{}/graph", ids[0]), None)
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    let (status, graph) = api
        .call(Method::GET, &format!("/v1/jobs/{}/graph", ids[1]), None)
        .await;
    assert_eq!(status, StatusCode::OK, "the other job draws: {graph}");
    let (status, _) = api
        .call(Method::GET, "/v1/jobs/not-an-id/graph", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_parent_and_its_child_show_each_other(pool: PgPool) {
    let api = Api::start(&pool).await;
    let child = json!({"name": "child", "input_schema": {},
        "steps": [{"name": "only", "target": "echo", "method": "m"}]});
    let parent = json!({"name": "parent", "input_schema": {},
        "steps": [{"name": "spawn", "start": {"workflow": "child", "input": ["n = 1"]}}]});
    for (name, document) in [("child", child), ("parent", parent)] {
        let path = format!("/v1/workflows/{name}");
        assert_eq!(
            api.call(Method::PUT, &path, Some(document)).await.0,
            StatusCode::CREATED
        );
    }
    let (_, job) = api
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "parent", "input": {}})),
        )
        .await;
    let parent_id = job["job_id"].as_str().unwrap().to_owned();
    // No claim loops here: the test runs the parent's segment itself.
    api.engine.run_once().await.unwrap();

    let (status, parent) = api
        .call(Method::GET, &format!("/v1/jobs/{parent_id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(parent["status"], "WAITING");
    let children = parent["children"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{parent}");
    assert_eq!(
        (
            children[0]["step"].clone(),
            children[0]["workflow_name"].clone()
        ),
        (json!("spawn"), json!("child"))
    );
    let child_id = children[0]["job_id"].as_str().unwrap();
    let (_, child) = api
        .call(Method::GET, &format!("/v1/jobs/{child_id}"), None)
        .await;
    assert_eq!(child["parent_job_id"], json!(parent_id));
    assert_eq!(
        (child["parent_step"].clone(), child["depth"].clone()),
        (json!("spawn"), json!(1))
    );
    assert_eq!(child["children"], json!([]));
}

/// A job waiting on a Kafka-target step shows the request it waits on:
/// the topic, the correlation id and until when, and the same deadline on
/// the job.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_waiting_on_a_kafka_target_shows_its_request(pool: PgPool) {
    let mut targets = flotilla_worker::test_support::echo_targets();
    targets.register_kafka(
        "fraud",
        flotilla_worker::test_support::kafka_target(std::time::Duration::from_secs(30)),
    );
    let api = Api::start_with(&pool, &[], targets).await;
    let workflow = json!({
        "name": "scored", "input_schema": {},
        "steps": [{"name": "score", "target": "fraud", "method": "score", "rules": ["amount = 3"]}]
    });
    assert_eq!(
        api.call(Method::PUT, "/v1/workflows/scored", Some(workflow))
            .await
            .0,
        StatusCode::CREATED
    );
    let (status, job) = api
        .call(
            Method::POST,
            "/v1/jobs",
            Some(json!({"workflow_name": "scored", "input": {}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let job_id = job["job_id"].as_str().unwrap().to_owned();
    assert_eq!(
        job["step_requests"],
        Value::Null,
        "nothing sent before it runs"
    );
    api.engine.run_once().await.unwrap();

    let (status, job) = api
        .call(Method::GET, &format!("/v1/jobs/{job_id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["status"], "WAITING");
    assert_eq!(job["outstanding_step"], "score");
    let request = &job["step_requests"]["score"];
    assert_eq!(request["topic"], "fraud-requests");
    assert_eq!(request["reply_topic"], "fraud-replies");
    assert!(
        request["correlation_id"]
            .as_str()
            .unwrap()
            .parse::<Uuid>()
            .is_ok(),
        "{request}"
    );
    assert!(request.get("reply").is_none(), "no reply yet: {request}");
    let deadline = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap();
    assert_eq!(
        deadline(&job["reply_deadline"]),
        deadline(&request["deadline"])
    );
}

/// A job whose run retention removed: the same request again is `410 Gone`
/// naming it a repeat and what the run came to; other content is still a
/// conflict; neither starts a second run.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_repeat_of_a_job_whose_run_retention_removed_is_410_and_starts_nothing(pool: PgPool) {
    let api = Api::start(&pool).await;
    api.call(Method::PUT, "/v1/workflows/approval", Some(approval()))
        .await;
    let job_id = Uuid::new_v4();
    let body = json!({"workflow_name": "approval", "input": {"amount": 5}, "job_id": job_id});
    assert_eq!(
        api.call(Method::POST, "/v1/jobs", Some(body.clone()))
            .await
            .0,
        StatusCode::CREATED
    );
    // What retention leaves of a cancelled run: its record, no row.
    sqlx::query(
        "WITH gone AS (DELETE FROM workflow_run WHERE job_id = $1
                       RETURNING job_id, workflow_name, request_digest, updated_at)
         INSERT INTO workflow_run_removed (job_id, workflow_name, request_digest, status, finished_at, removed_at)
         SELECT job_id, workflow_name, request_digest, 'CANCELLED', updated_at, now() FROM gone",
    )
    .bind(job_id)
    .execute(&pool)
    .await
    .unwrap();

    let (status, problem) = api.call(Method::POST, "/v1/jobs", Some(body)).await;
    assert_eq!(status, StatusCode::GONE, "{problem}");
    assert_eq!(problem["code"], "removed");
    assert_eq!(problem["final_status"], "CANCELLED");
    assert_eq!(problem["status"], 410, "problem+json keeps its own status");
    assert_eq!(problem["job_id"], json!(job_id));
    let other = json!({"workflow_name": "approval", "input": {"amount": 6}, "job_id": job_id});
    assert_eq!(
        api.call(Method::POST, "/v1/jobs", Some(other)).await.0,
        StatusCode::CONFLICT
    );
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(runs, 0, "no second run");
}
