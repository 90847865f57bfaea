//! The client against a running fleet (worker and relay binaries on
//! Apache Kafka, Avro through the registry): submissions through Kafka and
//! the API, their events once and in order; the runnable examples in
//! `examples/rust`, the consumer killed between its write and its
//! acknowledgement; and the Python package's tests (pytest) against the
//! same kind of fleet.

#![cfg(feature = "kafka")]

mod support;

use std::process::Command;
use std::time::Duration;

use flotilla_client::{Receipt, Submission, SubmitError, Submitter, WorkflowRunEventType};
use flotilla_tests::process::{Running, workspace_binary};
use flotilla_tests::{KAFKA_TEST_TIMEOUT, bootstrap_servers, schema_registry_url, unique};
use secrecy::SecretString;
use sqlx::PgPool;
use support::{Fleet, TOKEN, WORKFLOW, until_completed};
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

#[sqlx::test(migrator = "MIGRATOR")]
async fn requests_through_kafka_and_the_api_complete_and_their_events_come_once_in_order(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let fleet = Fleet::start(&pool).await;
        let kafka = Submitter::kafka(&support::broker())
            .unwrap()
            .with_request_topic(&fleet.request_topic);
        let api = Submitter::api(&fleet.api_url, Some(SecretString::from(TOKEN))).unwrap();
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

        let mut jobs = Vec::new();
        for n in 0..3 {
            let mut submission = Submission::new(WORKFLOW, &serde_json::json!({ "n": n })).unwrap();
            if n == 0 {
                submission = submission.with_traceparent(traceparent.to_owned(), None);
            }
            let receipt = kafka.submit(&submission).await.unwrap();
            assert!(matches!(receipt, Receipt::Kafka { .. }), "{receipt:?}");
            jobs.push(receipt.job_id());
        }
        let by_api = Submission::new(WORKFLOW, &serde_json::json!({ "n": 99 })).unwrap();
        let first = api.submit(&by_api).await.unwrap();
        let again = api.submit(&by_api).await.unwrap();
        assert_eq!(
            first,
            Receipt::Api {
                job_id: by_api.job_id(),
                created: true
            }
        );
        assert_eq!(
            again,
            Receipt::Api {
                job_id: by_api.job_id(),
                created: false
            },
            "the same job id twice is one job"
        );
        jobs.push(by_api.job_id());

        let mut stream = fleet.events();
        let seen = until_completed(&mut stream, &jobs).await;
        for (job, events) in &seen {
            let sequences: Vec<i64> = events.iter().map(|e| e.sequence()).collect();
            assert_eq!(
                sequences,
                (1..=events.len() as i64).collect::<Vec<_>>(),
                "job {job}"
            );
            let kinds: Vec<WorkflowRunEventType> = events.iter().map(|e| e.event_type()).collect();
            assert_eq!(
                kinds.first(),
                Some(&WorkflowRunEventType::Accepted),
                "job {job}"
            );
        }
        // The request's trace context reached the run.
        let stored: Option<String> =
            sqlx::query_scalar("SELECT traceparent FROM workflow_run WHERE job_id = $1")
                .bind(jobs[0])
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(stored.as_deref(), Some(traceparent));
        fleet.stop().await;
    })
    .await
    .expect("the test timed out");
}

/// `submit_and_wait` through the API and through Kafka: the result typed,
/// a failed job as its own error, a result of another type, a wait that
/// runs out; an input refused is a rejected submission through the API and
/// a FAILED job through Kafka.
#[sqlx::test(migrator = "MIGRATOR")]
async fn submit_and_wait_gives_the_typed_result_or_how_the_job_ended_either_way(pool: PgPool) {
    use flotilla_client::WaitError;
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let fleet = Fleet::start(&pool).await;
        let kafka = Submitter::kafka(&support::broker())
            .unwrap()
            .with_request_topic(&fleet.request_topic)
            .with_event_topic(&fleet.event_topic);
        let api = Submitter::api(&fleet.api_url, Some(SecretString::from(TOKEN))).unwrap();
        let wait = Duration::from_secs(60);
        let submission = |workflow: &str, input: serde_json::Value| {
            Submission::new(workflow, &input).unwrap()
        };
        for (route, submitter) in [("api", &api), ("kafka", &kafka)] {
            // Typed: the last step's answer, the echo service's `{"echo": <body>}`.
            #[derive(serde::Deserialize)]
            struct Shipped {
                echo: serde_json::Map<String, serde_json::Value>,
            }
            let shipped: Shipped = submitter
                .submit_and_wait(&submission(WORKFLOW, serde_json::json!({"n": 7})), wait)
                .await
                .unwrap_or_else(|e| panic!("{route}: {e}"));
            assert!(shipped.echo.is_empty(), "{route}: {:?}", shipped.echo);
            let mistyped = submitter
                .submit_and_wait::<Vec<String>>(&submission(WORKFLOW, serde_json::json!({})), wait)
                .await;
            assert!(matches!(mistyped, Err(WaitError::Result { .. })), "{route}: {mistyped:?}");
            let broken = submitter
                .submit_and_wait::<serde_json::Value>(&submission("breaking", serde_json::json!({})), wait)
                .await;
            assert!(
                matches!(&broken, Err(WaitError::Failed { error, .. }) if error.contains("404")),
                "{route}: {broken:?}"
            );
            let parked = submission("parked", serde_json::json!({}));
            let ran_out = submitter
                .submit_and_wait::<serde_json::Value>(&parked, Duration::from_secs(2))
                .await;
            assert!(
                matches!(ran_out, Err(WaitError::TimedOut { job_id, .. }) if job_id == parked.job_id()),
                "{route}"
            );
        }
        let refused = api
            .submit_and_wait::<serde_json::Value>(&submission("strict", serde_json::json!({})), wait)
            .await;
        assert!(
            matches!(&refused, Err(WaitError::Submit(SubmitError::Rejected(_)))),
            "{refused:?}"
        );
        let failed = kafka
            .submit_and_wait::<serde_json::Value>(&submission("strict", serde_json::json!({})), wait)
            .await;
        assert!(
            matches!(&failed, Err(WaitError::Failed { error, .. }) if error.contains("order")),
            "{failed:?}"
        );
        fleet.stop().await;
    })
    .await
    .expect("the test timed out");
}

/// `submit_all`: a thousand through Kafka and fifty through the API, each
/// outcome in its submission's place; one the API refuses fails alone.
#[sqlx::test(migrator = "MIGRATOR")]
async fn submit_all_sends_many_at_once_and_a_refused_one_fails_alone(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let fleet = Fleet::start(&pool).await;
        let kafka = Submitter::kafka(&support::broker())
            .unwrap()
            .with_request_topic(&fleet.request_topic);
        let api = Submitter::api(&fleet.api_url, Some(SecretString::from(TOKEN))).unwrap();
        let many = |count: usize| -> Vec<Submission> {
            (0..count)
                .map(|n| Submission::new(WORKFLOW, &serde_json::json!({ "n": n })).unwrap())
                .collect()
        };
        let through_kafka = many(1000);
        let receipts = kafka.submit_all(&through_kafka).await;
        assert_eq!(receipts.len(), 1000);
        for (submission, receipt) in through_kafka.iter().zip(&receipts) {
            let receipt = receipt.as_ref().unwrap();
            assert!(matches!(receipt, Receipt::Kafka { .. }), "{receipt:?}");
            assert_eq!(receipt.job_id(), submission.job_id());
        }
        let mut through_api = many(50);
        through_api[20] = Submission::new("no-such-workflow", &serde_json::json!({})).unwrap();
        let outcomes = api.submit_all(&through_api).await;
        for (n, (submission, outcome)) in through_api.iter().zip(&outcomes).enumerate() {
            match outcome {
                Err(SubmitError::Rejected(_)) if n == 20 => {}
                Ok(Receipt::Api {
                    job_id,
                    created: true,
                }) if n != 20 => {
                    assert_eq!(*job_id, submission.job_id());
                }
                other => panic!("submission {n}: {other:?}"),
            }
        }
        // Every one sent through Kafka became a row.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let rows: i64 =
                sqlx::query_scalar("SELECT count(*) FROM workflow_run WHERE job_id = ANY($1)")
                    .bind(
                        through_kafka
                            .iter()
                            .map(Submission::job_id)
                            .collect::<Vec<_>>(),
                    )
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            if rows == 1000 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{rows} of 1000 rows"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        fleet.stop().await;
    })
    .await
    .expect("the test timed out");
}

/// `Jobs`, every verb against a fleet: a job waited on while parked, then
/// signalled and waited on to its end; a step completed; list, events,
/// cancel, retry, the bulk dry run and schedules; a missing job and a
/// finished one's cancel classed. And every route it calls is in the
/// API's own OpenAPI document.
#[sqlx::test(migrator = "MIGRATOR")]
async fn the_jobs_client_drives_every_verb_and_its_routes_are_the_apis(pool: PgPool) {
    use flotilla_client::{JOBS_ROUTES, JobFilter, Jobs, JobsError};
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let fleet = Fleet::start(&pool).await;
        let jobs = Jobs::new(&fleet.api_url, Some(SecretString::from(TOKEN))).unwrap();
        let api = Submitter::api(&fleet.api_url, Some(SecretString::from(TOKEN))).unwrap();
        let submit = async |workflow: &str| {
            let submission = Submission::new(workflow, &serde_json::json!({})).unwrap();
            api.submit(&submission).await.unwrap().job_id()
        };
        let until_waiting = async |job_id: Uuid| {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let job = jobs.get(job_id).await.unwrap();
                if job.status == "WAITING" {
                    return job;
                }
                assert!(tokio::time::Instant::now() < deadline, "{job:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };

        let parked = submit("parked").await;
        let waiting = until_waiting(parked).await;
        assert_eq!(waiting.outstanding_step.as_deref(), Some("hold"));
        let receipt = jobs
            .signal(parked, "go", &serde_json::json!({"ok": true}), Some("k1"))
            .await
            .unwrap();
        assert!(receipt.is_object(), "{receipt}");
        let done = jobs.wait(parked, Duration::from_secs(20)).await.unwrap();
        assert!(done.is_finished() && done.status == "COMPLETED", "{done:?}");

        let approval = submit("approval").await;
        until_waiting(approval).await;
        jobs.complete_step(approval, "approve", &serde_json::json!({"ok": true}))
            .await
            .unwrap();
        assert_eq!(
            jobs.wait(approval, Duration::from_secs(20))
                .await
                .unwrap()
                .status,
            "COMPLETED"
        );

        let filter = JobFilter {
            workflow_name: Some("parked".into()),
            ..JobFilter::default()
        };
        let page = jobs.list(&filter, 10, None).await.unwrap();
        assert!(page.jobs.iter().any(|job| job.job_id == parked), "{page:?}");
        let events = jobs.events(parked).await.unwrap();
        assert_eq!(events[0]["event_type"], "ACCEPTED", "{events:?}");

        let cancelled = submit("parked").await;
        until_waiting(cancelled).await;
        assert_eq!(
            jobs.cancel(cancelled, Some("not needed"))
                .await
                .unwrap()
                .status,
            "CANCELLED"
        );
        let again = jobs.cancel(cancelled, None).await;
        assert!(matches!(again, Err(JobsError::Conflict(_))), "{again:?}");
        assert_eq!(jobs.retry(cancelled).await.unwrap().status, "QUEUED");
        let missing = jobs.get(Uuid::new_v4()).await;
        assert!(
            matches!(missing, Err(JobsError::NotFound(_))),
            "{missing:?}"
        );
        let counted = jobs.bulk(&filter, true, true).await.unwrap();
        assert_eq!(
            (counted["dry_run"].clone(), counted["changed"].clone()),
            (serde_json::json!(true), serde_json::json!(0))
        );
        assert!(counted["matched"].as_u64().unwrap() >= 1, "{counted}");
        let empty = jobs.bulk(&JobFilter::default(), false, true).await;
        assert!(matches!(empty, Err(JobsError::Rejected(_))), "{empty:?}");
        assert!(jobs.schedules().await.unwrap()["schedules"].is_array());

        // Labels sent through Kafka are kept, searchable and echoed on events.
        let kafka = Submitter::kafka(&support::broker())
            .unwrap()
            .with_request_topic(&fleet.request_topic);
        let labelled = Submission::new(WORKFLOW, &serde_json::json!({}))
            .unwrap()
            .with_metadata([("customer", "ada")]);
        kafka.submit(&labelled).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let job = loop {
            match jobs.wait(labelled.job_id(), Duration::from_secs(10)).await {
                Ok(job) if job.is_finished() => break job,
                Ok(_) | Err(JobsError::NotFound(_)) => {}
                Err(e) => panic!("{e}"),
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the labelled job never finished"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(job.rest["metadata"], serde_json::json!({"customer": "ada"}));
        let events = jobs.events(labelled.job_id()).await.unwrap();
        assert!(
            events
                .iter()
                .all(|e| e["metadata"] == serde_json::json!({"customer": "ada"})),
            "{events:?}"
        );

        // The client's routes are the API's.
        let document: serde_json::Value = reqwest::get(format!("{}/openapi.json", fleet.api_url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for (method, path) in JOBS_ROUTES {
            assert!(
                document["paths"][path][method.to_lowercase()].is_object(),
                "{method} {path} is not in the API's OpenAPI document"
            );
        }
        fleet.stop().await;
    })
    .await
    .expect("the test timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn each_refusal_is_classified_once_rejected_or_unavailable(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let fleet = Fleet::start(&pool).await;
        let api = Submitter::api(&fleet.api_url, Some(SecretString::from(TOKEN))).unwrap();
        // About the request: an unknown workflow (422), a blank name (a
        // rule, refused before anything is sent).
        let unknown = Submission::new(&unique("no-such-workflow"), &serde_json::json!({})).unwrap();
        let refused = api.submit(&unknown).await.unwrap_err();
        assert!(
            matches!(&refused, SubmitError::Rejected(text) if text.contains("422")),
            "{refused}"
        );
        assert!(!refused.is_retryable());
        let kafka = Submitter::kafka(&support::broker())
            .unwrap()
            .with_request_topic(&fleet.request_topic);
        let blank = Submission::new(" ", &serde_json::json!({})).unwrap();
        assert!(matches!(
            kafka.submit(&blank).await,
            Err(SubmitError::Rejected(_))
        ));
        // About the credentials: a wrong token.
        let stranger = Submitter::api(&fleet.api_url, Some(SecretString::from("nope"))).unwrap();
        let denied = stranger
            .submit(&Submission::new(WORKFLOW, &1).unwrap())
            .await
            .unwrap_err();
        assert!(matches!(denied, SubmitError::Settings(_)), "{denied}");
        // About the world: nothing listens.
        let nowhere = format!("http://127.0.0.1:{}", flotilla_tests::free_port());
        let down = Submitter::api(&nowhere, None).unwrap();
        let away = down
            .submit(&Submission::new(WORKFLOW, &1).unwrap())
            .await
            .unwrap_err();
        assert!(away.is_retryable(), "{away}");
        // A URL that is no URL is the settings' fault, found before sending.
        let schemeless = Submitter::api("127.0.0.1:8080", None).unwrap();
        let unusable = schemeless
            .submit(&Submission::new(WORKFLOW, &1).unwrap())
            .await
            .unwrap_err();
        assert!(matches!(unusable, SubmitError::Settings(_)), "{unusable}");
        // Hostile answers: bodies that are no problem document, a 400 and
        // a 503, each classed by its status alone.
        let hostile = hostile_api().await;
        let answered = Submitter::api(&hostile, None).unwrap();
        for (workflow, expected_retryable) in [("bad", false), ("busy", true)] {
            let error = answered
                .submit(&Submission::new(workflow, &1).unwrap())
                .await
                .unwrap_err();
            assert_eq!(error.is_retryable(), expected_retryable, "{error}");
            assert!(
                matches!(
                    (&error, expected_retryable),
                    (SubmitError::Rejected(_), false) | (SubmitError::Unavailable(_), true)
                ),
                "{error}"
            );
        }
        fleet.stop().await;
    })
    .await
    .expect("the test timed out");
}

/// An API that answers a submission of workflow `bad` with a 400 and of any
/// other with a 503, both with an HTML body and a wrong content type.
async fn hostile_api() -> String {
    use axum::routing::post;
    let answer = |axum::Json(body): axum::Json<serde_json::Value>| async move {
        let status = if body["workflow_name"] == "bad" {
            axum::http::StatusCode::BAD_REQUEST
        } else {
            axum::http::StatusCode::SERVICE_UNAVAILABLE
        };
        (status, "<html>\u{0}not json</html>")
    };
    let app = axum::Router::new().route("/v1/jobs", post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Runs an example binary to its end; returns (exit code, output lines).
async fn example(
    name: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
) -> (Option<i32>, Vec<String>) {
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(workspace_binary(name));
        command
            .args(args)
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
            .env("SCHEMA_REGISTRY_URL", schema_registry_url())
            .env_remove("OUTCOMES_DIE_AFTER_WRITES")
            .envs(env);
        let mut running = Running::start(command);
        let status = running.wait(Duration::from_secs(90));
        (status.code(), std::mem::take(&mut running.output))
    })
    .await
    .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_example_consumer_killed_between_its_write_and_its_ack_applies_each_event_once(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let fleet = Fleet::start(&pool).await;
        let s = |v: &str| v.to_owned();
        let (code, out) = example(
            "flotilla-example-produce",
            vec![
                s("--workflow"),
                s(WORKFLOW),
                s("--count"),
                s("4"),
                s("--topic"),
                fleet.request_topic.clone(),
            ],
            vec![],
        )
        .await;
        assert_eq!(code, Some(0), "{out:?}");
        let jobs: Vec<Uuid> = out
            .iter()
            .filter_map(|line| Uuid::parse_str(line.trim()).ok())
            .collect();
        assert_eq!(jobs.len(), 4, "{out:?}");
        // Each job's whole stream, to compare the consumer's table with.
        let expected = until_completed(&mut fleet.events(), &jobs).await;

        let group = unique("outcomes");
        let consumer = |die_after: Option<u32>| {
            let mut env = vec![("OUTCOMES_DATABASE_URL", fleet.database_url.clone())];
            if let Some(n) = die_after {
                env.push(("OUTCOMES_DIE_AFTER_WRITES", n.to_string()));
            }
            let args = vec![
                s("--group"),
                group.clone(),
                s("--topic"),
                fleet.event_topic.clone(),
                s("--until-finished"),
                s("4"),
                // The same static member each time: restarted with its id,
                // it holds the killed one's partitions at once instead of
                // after that member's session timeout.
                s("--instance-id"),
                format!("{group}-member"),
            ];
            example("flotilla-example-outcomes", args, env)
        };
        let (code, out) = consumer(Some(3)).await;
        assert_ne!(code, Some(0), "the consumer was to die: {out:?}");
        assert!(
            out.iter().any(|l| l.contains("dying after 3 writes")),
            "{out:?}"
        );
        let (code, out) = consumer(None).await;
        assert_eq!(code, Some(0), "{out:?}");
        let summary = out
            .iter()
            .find(|l| l.contains("repeats skipped"))
            .unwrap_or_else(|| panic!("{out:?}"));
        let repeats: u64 = summary.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(
            repeats >= 1,
            "the event written just before the kill came again: {summary}"
        );

        let rows: Vec<(Uuid, String, i32, i64, i32)> = sqlx::query_as(
            "SELECT job_id, status, events_applied, last_sequence, gaps FROM job_outcome",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), 4, "{rows:?}");
        for (job, status, applied, last, gaps) in rows {
            let count = expected[&job].len();
            assert_eq!(
                (status.as_str(), applied as usize, last as usize, gaps),
                ("COMPLETED", count, count, 0),
                "job {job}: every event applied once"
            );
        }
        fleet.stop().await;
    })
    .await
    .expect("the test timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_python_package_passes_its_tests_against_the_fleet(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let (_, examples) = flotilla_tests::examples_python();
        let root = examples.parent().unwrap().to_owned();
        let package = root.join("clients/python");
        // The wheel, installed into a fresh environment and type-checked.
        let installed = std::env::temp_dir().join(format!("flotilla-wheel-{}", Uuid::new_v4()));
        let built = tokio::task::spawn_blocking({
            let (root, installed) = (root.clone(), installed.clone());
            move || {
                Command::new(root.join("scripts/python-package"))
                    .arg(&installed)
                    .output()
                    .unwrap()
            }
        })
        .await
        .unwrap();
        assert!(
            built.status.success(),
            "scripts/python-package failed:\n{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let python = String::from_utf8(built.stdout).unwrap().trim().to_owned();
        let pytest = std::path::Path::new(&python).with_file_name("pytest");
        let fleet = Fleet::start(&pool).await;
        let mut command = Command::new(pytest);
        // From outside the tree, with no PYTHONPATH: only the installed
        // package can be imported.
        command
            .args(["-q", "-p", "no:cacheprovider", "--rootdir"])
            .arg(&package)
            .arg(package.join("tests"))
            .current_dir(&installed)
            .env_remove("PYTHONPATH")
            .env("FLOTILLA_PACKAGE_INSTALLED", "1")
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers())
            .env("SCHEMA_REGISTRY_URL", schema_registry_url())
            .env("FLOTILLA_REQUEST_TOPIC", &fleet.request_topic)
            .env("FLOTILLA_EVENT_TOPIC", &fleet.event_topic)
            .env("FLOTILLA_URL", &fleet.api_url)
            .env("FLOTILLA_TOKEN", TOKEN)
            .env("FLOTILLA_WORKFLOW", WORKFLOW)
            .env("PYTHONDONTWRITEBYTECODE", "1");
        let (status, output) = tokio::task::spawn_blocking(move || {
            let mut pytest = Running::start(command);
            let status = pytest.wait(Duration::from_secs(150));
            (status, std::mem::take(&mut pytest.output))
        })
        .await
        .unwrap();
        assert!(status.success(), "pytest failed:\n{}", output.join("\n"));
        eprintln!("{}", output.join("\n"));
        let summary = output
            .iter()
            .rev()
            .find(|l| l.contains("passed"))
            .unwrap_or_else(|| panic!("{output:?}"));
        assert!(
            !summary.contains("failed") && !summary.contains("skipped"),
            "{summary}"
        );
        fleet.stop().await;
        std::fs::remove_dir_all(installed).unwrap();
    })
    .await
    .expect("the test timed out");
}
