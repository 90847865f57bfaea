//! The web console in a real browser: headless Chromium over WebDriver
//! against a whole worker on port 0 and a real database. Each test signs in
//! through the form and keeps screenshots of what it saw under
//! `test-output/console/`.

mod browser;

use std::time::Duration;

use fantoccini::Locator;
use flotilla_worker::test_support::{TEST_TOKEN, TestApp, echo_targets};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use browser::Browser;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;
/// A whole test, browser start-up included: a hang fails here.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);

/// Check, then a human approves with `{"approved": true|false, "note": "…"}`.
fn approval() -> Value {
    json!({
        "name": "approval",
        "input_schema": {"type": "object"},
        "steps": [
            {"name": "check", "target": "echo", "method": "check", "rules": ["amount = input.amount"]},
            {"name": "approve", "target": "echo", "method": "approve", "completion": "external",
             "output_schema": {"type": "object", "required": ["approved"],
                               "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}}},
             "validate": ["response.approved == true"]}
        ]
    })
}

async fn worker(pool: &PgPool, claim_loops: &str) -> TestApp {
    worker_with(pool, &["--worker-count", claim_loops]).await
}

/// A worker with `flags`, the approval workflow stored.
async fn worker_with(pool: &PgPool, flags: &[&str]) -> TestApp {
    let app = TestApp::spawn_with(pool.clone(), flags, echo_targets()).await;
    let client = flotilla_runtime::tls::http_client().build().unwrap();
    let stored = client
        .put(format!("{}/v1/workflows/approval", app.url))
        .bearer_auth(TEST_TOKEN)
        .json(&approval())
        .send()
        .await
        .unwrap();
    assert_eq!(stored.status(), StatusCode::CREATED);
    app
}

/// PUTs `body` to `path` on `app` with the test token; it must be created.
async fn put_created(app: &TestApp, path: &str, body: &Value) {
    let stored = flotilla_runtime::tls::http_client()
        .build()
        .unwrap()
        .put(format!("{}{path}", app.url))
        .bearer_auth(TEST_TOKEN)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(stored.status(), StatusCode::CREATED, "PUT {path}");
}

/// Submits a job of the stored `workflow` and waits until it parks.
async fn waiting_job(app: &TestApp, workflow: &str) -> Uuid {
    let job: Value = flotilla_runtime::tls::http_client()
        .build()
        .unwrap()
        .post(format!("{}/v1/jobs", app.url))
        .bearer_auth(TEST_TOKEN)
        .json(&json!({"workflow_name": workflow, "input": {}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job_id: Uuid = job["job_id"].as_str().unwrap().parse().unwrap();
    wait_for_status(app, job_id, "WAITING").await;
    job_id
}

async fn submit(app: &TestApp, input: Value) -> Uuid {
    let response = flotilla_runtime::tls::http_client()
        .build()
        .unwrap()
        .post(format!("{}/v1/jobs", app.url))
        .bearer_auth(TEST_TOKEN)
        .json(&json!({"workflow_name": "approval", "input": input}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let job: Value = response.json().await.unwrap();
    job["job_id"].as_str().unwrap().parse().unwrap()
}

async fn status_of(app: &TestApp, job_id: Uuid) -> String {
    app.engine
        .job(job_id)
        .await
        .unwrap()
        .unwrap()
        .status
        .to_string()
}

/// Polls the job until it is in `status`, within the page wait.
async fn wait_for_status(app: &TestApp, job_id: Uuid, status: &str) {
    let deadline = tokio::time::Instant::now() + browser::PAGE_WAIT;
    loop {
        let now = status_of(app, job_id).await;
        if now == status {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {job_id} stayed {now}, not {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn within_timeout(test: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("the browser test hung");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_wrong_token_is_refused_and_the_right_one_signs_in(pool: PgPool) {
    within_timeout(async {
        let app = worker(&pool, "0").await;
        let job_id = submit(&app, json!({"amount": 1})).await;
        let browser = Browser::start(&app.url).await;
        browser.open("#/jobs").await;
        browser.fill("#token", "not-the-token").await;
        browser.click("#sign-in").await;
        let refused = browser
            .text_until("#sign-in-error", |t| !t.is_empty())
            .await;
        assert!(refused.contains("not accepted"), "{refused}");
        browser.screenshot("sign-in-refused").await;
        assert!(
            browser
                .client
                .find(Locator::Css("#jobs-table"))
                .await
                .is_err()
        );

        browser.fill("#token", TEST_TOKEN).await;
        browser.click("#sign-in").await;
        let row = browser
            .find(&format!("tr.job-row[data-job-id='{job_id}']"))
            .await;
        assert!(row.text().await.unwrap().contains("QUEUED"));
        browser.screenshot("jobs").await;
        browser.close().await;
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_found_by_id_shows_its_timeline(pool: PgPool) {
    within_timeout(async {
        let app = worker(&pool, "2").await;
        let job_id = submit(&app, json!({"amount": 7})).await;
        wait_for_status(&app, job_id, "WAITING").await;
        let browser = Browser::start(&app.url).await;
        browser.sign_in(TEST_TOKEN).await;
        browser.fill("#job-search", &job_id.to_string()).await;
        browser.click("#job-search-go").await;
        browser
            .text_until("#job-id", |t| t.contains(&job_id.to_string()))
            .await;
        browser
            .text_until("#job-status", |t| t.contains("WAITING"))
            .await;
        let timeline = browser
            .text_until("#timeline", |t| t.contains("WAITING"))
            .await;
        for event in ["ACCEPTED", "STEP_CHECKPOINT", "WAITING"] {
            assert!(timeline.contains(event), "{event} missing from {timeline}");
        }
        let rows = browser
            .client
            .find_all(Locator::Css("#timeline tr.event-row"))
            .await
            .unwrap();
        assert_eq!(rows.len(), 3);
        browser.screenshot("job").await;
        browser.close().await;
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_waiting_step_answered_through_the_form_completes_the_job(pool: PgPool) {
    within_timeout(async {
        let app = worker(&pool, "2").await;
        let job_id = submit(&app, json!({"amount": 12})).await;
        wait_for_status(&app, job_id, "WAITING").await;
        let browser = Browser::start(&app.url).await;
        browser.sign_in(TEST_TOKEN).await;
        browser.open("#/waiting").await;
        let row = format!("tr.waiting-row[data-job-id='{job_id}']");
        assert!(browser.find(&row).await.text().await.unwrap().contains("approve"));
        browser.screenshot("waiting").await;
        browser.click(&format!("{row} .answer-link")).await;
        // Fields drawn from the step's output_schema.
        browser.click("#field-approved").await;
        browser.fill("#field-note", "looks fine <b>to me</b>").await;
        browser.screenshot("answer").await;
        browser.click("#answer-submit").await;
        let outcome = browser.find("#answer-outcome[data-outcome]").await;
        assert_eq!(outcome.attr("data-outcome").await.unwrap().as_deref(), Some("Completed"));
        wait_for_status(&app, job_id, "COMPLETED").await;
        let row = app.engine.job(job_id).await.unwrap().unwrap();
        assert_eq!(
            row.checkpoints.0[1]["response"],
            json!({"approved": true, "note": "looks fine <b>to me</b>"})
        );
        // The same answer again: the API says it was done before.
        browser.click("#answer-submit").await;
        browser
            .find("#answer-outcome[data-outcome='AlreadyDone'], #answer-outcome[data-outcome='WrongState']")
            .await;
        browser.close().await;
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_dead_job_is_retried_after_confirmation(pool: PgPool) {
    within_timeout(async {
        let app = worker(&pool, "0").await;
        let job_id = submit(&app, json!({"amount": 3})).await;
        // Its attempts ran out (as the sweeper leaves it after the last lapse).
        sqlx::query("UPDATE workflow_run SET status = 'DEAD', error = 'lease lapsed 3 times' WHERE job_id = $1")
            .bind(job_id)
            .execute(&pool)
            .await
            .unwrap();
        let browser = Browser::start(&app.url).await;
        browser.sign_in(TEST_TOKEN).await;
        browser.open(&format!("#/jobs/{job_id}")).await;
        browser.text_until("#job-status", |t| t.contains("DEAD")).await;
        browser.click("#retry").await;
        browser.find("#confirm-no").await;
        browser.screenshot("retry-confirm").await;
        browser.click("#confirm-no").await;
        assert_eq!(status_of(&app, job_id).await, "DEAD", "nothing happens without confirmation");
        browser.click("#retry").await;
        browser.click("#confirm-yes").await;
        browser.text_until("#job-status", |t| t.contains("QUEUED")).await;
        assert_eq!(status_of(&app, job_id).await, "QUEUED");
        browser.close().await;
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_hostile_input_renders_as_text_and_runs_nothing(pool: PgPool) {
    within_timeout(async {
        let app = worker(&pool, "0").await;
        let script = "<script>window.pwned = 'script'</script>";
        let image = "\"><img src=x onerror=\"window.pwned = 'img'\">";
        let job_id = submit(&app, json!({"amount": 1, "note": script, "name": image})).await;
        let browser = Browser::start(&app.url).await;
        browser.sign_in(TEST_TOKEN).await;
        browser.open(&format!("#/jobs/{job_id}")).await;
        let input = browser.text_until("#job-input pre", |t| t.contains("pwned")).await;
        let shown: Value = serde_json::from_str(&input)
            .unwrap_or_else(|e| panic!("the input is not shown as its JSON text ({e}): {input}"));
        assert_eq!(shown["note"], script);
        assert_eq!(shown["name"], image);
        let injected = browser
            .client
            .execute(
                "return [typeof window.pwned, document.querySelectorAll('img[src=x], #job-input script').length]",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(injected, json!(["undefined", 0]));
        browser.screenshot("hostile-input").await;
        browser.close().await;
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_workflow_and_fleet_views_draw_what_is_stored(pool: PgPool) {
    within_timeout(async {
        let app = worker(&pool, "2").await;
        let job_id = submit(&app, json!({"amount": 2})).await;
        wait_for_status(&app, job_id, "WAITING").await;
        // A second version: its drawing shows, and the diff against the first.
        let mut second = approval();
        second["max_attempts"] = json!(5);
        put_created(&app, "/v1/workflows/approval", &second).await;
        let browser = Browser::start(&app.url).await;
        browser.sign_in(TEST_TOKEN).await;
        browser.open("#/workflows/approval").await;
        let drawing = browser
            .text_until("#workflow-drawing", |t| t.contains("approve"))
            .await;
        assert!(
            drawing.contains("echo.check") && drawing.contains("echo.approve"),
            "{drawing}"
        );
        let added = browser
            .text_until("#diff .diff-add", |t| t.contains("max_attempts"))
            .await;
        assert!(added.contains('5'), "{added}");
        let removed = browser
            .client
            .find_all(Locator::Css("#diff .diff-del"))
            .await
            .unwrap();
        assert!(removed.is_empty(), "the second version only adds a field");
        browser.screenshot("workflow").await;
        browser.open("#/fleet").await;
        browser
            .text_until("#workers", |t| t.contains("test-worker"))
            .await;
        browser.find("#finished-chart").await;
        browser.text_until("#outbox", |t| !t.is_empty()).await;
        browser.screenshot("fleet").await;
        browser.close().await;
    })
    .await;
}

/// A token that may only read sees jobs, but the console offers it no
/// retry, cancel or answer (the API would refuse them anyway).
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_read_only_token_is_offered_nothing_it_cannot_do(pool: PgPool) {
    within_timeout(async {
        let tokens = format!("{TEST_TOKEN}, viewer:read");
        let app = worker_with(&pool, &["--worker-count", "2", "--api-tokens", &tokens]).await;
        let job_id = submit(&app, json!({"amount": 5})).await;
        wait_for_status(&app, job_id, "WAITING").await;
        let browser = Browser::start(&app.url).await;
        browser.sign_in("viewer").await;
        browser.open(&format!("#/jobs/{job_id}")).await;
        browser
            .text_until("#job-status", |t| t.contains("WAITING"))
            .await;
        for action in ["#cancel", "#retry", "#job-answer"] {
            let hidden = browser
                .client
                .execute(
                    "return document.querySelector(arguments[0]).hidden;",
                    vec![json!(action)],
                )
                .await
                .unwrap();
            assert_eq!(
                hidden,
                json!(true),
                "{action} is offered to a read-only token"
            );
        }
        browser.screenshot("read-only-job").await;
        browser.open("#/waiting").await;
        let row = format!("tr.waiting-row[data-job-id='{job_id}']");
        browser.find(&row).await;
        assert!(
            browser
                .client
                .find(Locator::Css(&format!("{row} .answer-link")))
                .await
                .is_err(),
            "an answer link is offered to a read-only token"
        );
        browser.open(&format!("#/waiting/{job_id}")).await;
        let refused = browser
            .text_until("#answer-not-allowed", |t| !t.is_empty())
            .await;
        assert!(refused.contains("answer"), "{refused}");
        assert_eq!(status_of(&app, job_id).await, "WAITING");
        browser.close().await;
    })
    .await;
}

/// A graph workflow is drawn by depth, and a running job's steps are drawn
/// coloured by state: completed, skipped, waiting for a human, pending; a
/// step that names its verb and path shows the call it made.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_graph_job_is_drawn_with_each_step_in_its_state(pool: PgPool) {
    within_timeout(async {
        let app = worker(&pool, "2").await;
        let graph = json!({
            "name": "drawn", "input_schema": {},
            "steps": [
                {"name": "fetch", "target": "echo", "verb": "GET", "path": "/items/{'a/b'}", "needs": []},
                {"name": "check", "target": "echo", "method": "check", "needs": ["fetch"], "when": "false"},
                {"name": "approve", "target": "echo", "method": "approve", "needs": ["fetch"], "completion": "external"},
                {"name": "ship", "target": "echo", "method": "ship", "needs": ["check", "approve"]}
            ]
        });
        put_created(&app, "/v1/workflows/drawn", &graph).await;
        let job_id = waiting_job(&app, "drawn").await;

        let browser = Browser::start(&app.url).await;
        browser.sign_in(TEST_TOKEN).await;
        browser.open(&format!("#/jobs/{job_id}")).await;
        let drawn = browser
            .text_until("#job-graph", |t| t.contains("waiting"))
            .await;
        for state in ["completed", "skipped", "waiting", "pending"] {
            assert!(drawn.contains(state), "{state} missing from {drawn}");
        }
        // The call a shaped step made, its value encoded.
        assert!(drawn.contains("GET /items/a%2Fb"), "{drawn}");
        for (step, state) in [("fetch", "completed"), ("check", "skipped"), ("approve", "waiting"), ("ship", "pending")] {
            let node = browser
                .find(&format!("#job-graph g.step[data-step='{step}']"))
                .await;
            let class = node.attr("class").await.unwrap().unwrap_or_default();
            assert!(class.contains(&format!("state-{state}")), "{step}: {class}");
        }
        browser.screenshot("job-graph").await;

        browser.open("#/workflows/drawn").await;
        browser
            .text_until("#workflow-drawing", |t| t.contains("ship"))
            .await;
        let boxes = browser
            .client
            .find_all(Locator::Css("#workflow-drawing g.step"))
            .await
            .unwrap();
        assert_eq!(boxes.len(), 4);
        let arrows = browser
            .client
            .find_all(Locator::Css("#workflow-drawing path.arrow"))
            .await
            .unwrap();
        assert_eq!(arrows.len(), 4, "one arrow per need");
        browser.close().await;
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_signal_sent_from_the_job_page_resumes_the_waiting_job(pool: PgPool) {
    within_timeout(async {
        let app = worker(&pool, "2").await;
        let waits = json!({
            "name": "waits", "input_schema": {},
            "steps": [
                {"name": "prepare", "target": "echo", "method": "prepare"},
                {"name": "paid", "wait_for": "payment", "output_schema": {"type": "object", "required": ["amount"]}}
            ]
        });
        put_created(&app, "/v1/workflows/waits", &waits).await;
        let job_id = waiting_job(&app, "waits").await;

        let browser = Browser::start(&app.url).await;
        browser.sign_in(TEST_TOKEN).await;
        browser.open(&format!("#/jobs/{job_id}")).await;
        browser.find("#signal-form:not([hidden])").await;
        // A payload the waiting step's schema refuses is refused, and said so.
        browser.fill("#signal-name", "payment").await;
        browser.fill("#signal-payload", r#"{"note": "no amount"}"#).await;
        browser.click("#signal-send").await;
        let refused = browser
            .text_until("#signal-outcome", |t| t.starts_with("Refused"))
            .await;
        assert!(refused.contains("amount"), "{refused}");
        browser.fill("#signal-payload", r#"{"amount": 12}"#).await;
        browser.click("#signal-send").await;
        browser
            .text_until("#signal-outcome", |t| t.contains("is queued"))
            .await;
        wait_for_status(&app, job_id, "COMPLETED").await;
        let listed = browser
            .text_until("#signals", |t| t.contains("CONSUMED"))
            .await;
        assert!(listed.contains("paid"), "the step that took it: {listed}");
        browser.screenshot("job-signal").await;
        browser.close().await;
    })
    .await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_schedules_page_lists_creates_and_pauses_schedules(pool: PgPool) {
    within_timeout(async {
        let app = worker(&pool, "0").await;
        let every_hour =
            json!({"workflow_name": "approval", "input": {"amount": 1}, "interval": "1h"});
        put_created(&app, "/v1/schedules/hourly-check", &every_hour).await;

        let browser = Browser::start(&app.url).await;
        browser.sign_in(TEST_TOKEN).await;
        browser.open("#/schedules").await;
        let row = browser
            .text_until("#schedules-table", |t| t.contains("hourly-check"))
            .await;
        assert!(row.contains("every 1h"), "{row}");
        browser
            .click("tr.schedule-row[data-name='hourly-check'] button.schedule-toggle")
            .await;
        browser
            .text_until("#schedules-table", |t| t.contains("paused"))
            .await;
        let paused = app.engine.schedule("hourly-check").await.unwrap();
        assert!(paused.paused, "the button paused it");

        // A schedule made from the page; a bad cron is refused, said so.
        browser.fill("#schedule-name", "morning").await;
        browser.fill("#schedule-input", r#"{"amount": 2}"#).await;
        browser.fill("#schedule-cron", "every morning").await;
        browser.click("#schedule-save").await;
        let refused = browser
            .text_until("#schedule-outcome", |t| t.starts_with("Refused"))
            .await;
        assert!(refused.contains("cron"), "{refused}");
        browser.fill("#schedule-cron", "0 8 * * *").await;
        browser.fill("#schedule-time-zone", "Europe/Paris").await;
        browser.click("#schedule-save").await;
        browser
            .text_until("#schedules-table", |t| {
                t.contains("0 8 * * * (Europe/Paris)")
            })
            .await;
        assert_eq!(
            app.engine.schedule("morning").await.unwrap().workflow_name,
            "approval"
        );
        browser.screenshot("schedules").await;
        browser.close().await;
    })
    .await;
}

/// A job waiting on a Kafka-target step shows, on its page, the request it
/// waits on: the step, the topic, the correlation id, and that no reply came.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_job_waiting_on_a_kafka_target_shows_its_request(pool: PgPool) {
    use flotilla_worker::test_support::kafka_target;
    within_timeout(async {
        let mut targets = echo_targets();
        targets.register_kafka("fraud", kafka_target(Duration::from_secs(300)));
        let app = TestApp::spawn_with(pool.clone(), &["--worker-count", "1"], targets).await;
        let workflow = json!({
            "name": "scored", "input_schema": {},
            "steps": [{"name": "score", "target": "fraud", "method": "score", "rules": ["amount = 3"]}]
        });
        put_created(&app, "/v1/workflows/scored", &workflow).await;
        let job_id = waiting_job(&app, "scored").await;
        let correlation: String = sqlx::query_scalar(
            "SELECT step_requests -> 'score' ->> 'correlation_id' FROM workflow_run WHERE job_id = $1",
        )
        .bind(job_id)
        .fetch_one(&pool)
        .await
        .unwrap();

        let browser = Browser::start(&app.url).await;
        browser.sign_in(TEST_TOKEN).await;
        browser.fill("#job-search", &job_id.to_string()).await;
        browser.click("#job-search-go").await;
        let shown = browser
            .text_until("#job-kafka-requests", |t| t.contains("fraud-requests"))
            .await;
        assert!(shown.contains("score"), "{shown}");
        assert!(shown.contains(&correlation), "{shown}");
        assert!(shown.contains("waiting"), "{shown}");
        browser.close().await;
    })
    .await;
}

/// With a filter applied, the jobs page counts every matching job (a dry
/// run), says how many, and retries them all only once that count is
/// confirmed.
#[sqlx::test(migrator = "MIGRATOR")]
async fn every_job_a_filter_matches_is_counted_then_retried_from_the_jobs_page(pool: PgPool) {
    use flotilla_worker::engine::{RefusalMode, Submission, WorkflowRef};
    within_timeout(async {
        let app = worker(&pool, "0").await;
        let strict = json!({"name": "strict", "input_schema": {"type": "object", "required": ["order"]},
            "steps": [{"name": "only", "target": "echo", "method": "go"}]});
        put_created(&app, "/v1/workflows/strict", &strict).await;
        let mut failed = Vec::new();
        // Three labelled FAILED jobs, and one unlabelled the filter leaves out.
        for n in 0..4 {
            let job_id = Uuid::new_v4();
            let submission = Submission {
                metadata: (n < 3).then(|| [("batch".to_owned(), "b1".to_owned())].into()),
                priority: 0,
                job_id,
                workflow: WorkflowRef::Stored("strict".into()),
                input: json!({}),
                traceparent: None,
                tracestate: None,
            };
            app.engine.submit(submission, RefusalMode::Record).await.unwrap();
            if n < 3 {
                failed.push(job_id);
            }
        }

        let browser = Browser::start(&app.url).await;
        browser.sign_in(TEST_TOKEN).await;
        // The job page shows a job's labels.
        browser.open(&format!("#/jobs/{}", failed[0])).await;
        browser.text_until("#job-metadata", |t| t == "batch=b1").await;
        // The filters: status, workflow and the label.
        browser.open("#/jobs?status=FAILED&workflow_name=strict&metadata=%7B%22batch%22%3A%22b1%22%7D").await;
        assert_eq!(browser.find("#filter-metadata").await.prop("value").await.unwrap().as_deref(), Some("batch=b1"));
        browser.find("#bulk:not([hidden])").await;
        browser.click("#bulk-retry").await;
        browser.text_until("#bulk-outcome", |t| t.contains("3 job(s) match")).await;
        for job_id in &failed {
            assert_eq!(status_of(&app, *job_id).await, "FAILED", "a count changes nothing");
        }
        browser.click("#bulk-confirm").await;
        let done = browser.text_until("#bulk-outcome", |t| t.contains("retried")).await;
        assert!(done.starts_with("3 retried, 0 passed over"), "{done}");
        for job_id in &failed {
            wait_for_status(&app, *job_id, "QUEUED").await;
        }
        browser.screenshot("jobs-bulk-retry").await;
        browser.close().await;
    })
    .await;
}
