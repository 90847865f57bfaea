//! The CLI against a running fleet member: the API, the claim loops and a
//! relay in this process, the `flotilla` binary driving them over HTTP and
//! following the event topic (submit → get → complete → tail until terminal).

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use flotilla_relay::{Relay, RelaySettings};
use flotilla_store::SystemClock;
use flotilla_tests::process::Running;
use flotilla_tests::{KAFKA_TEST_TIMEOUT, bootstrap_servers, create_topic, unique};
use flotilla_worker::test_support::{TEST_TOKEN, TestApp};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// Runs `flotilla` with `args` off the async runtime; returns (exit code, stdout+stderr lines).
async fn flotilla(
    env: Vec<(&'static str, String)>,
    args: Vec<String>,
) -> (Option<i32>, Vec<String>) {
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
        command.args(&args).envs(env);
        let mut running = Running::start(command);
        let status = running.wait(Duration::from_secs(60));
        (status.code(), std::mem::take(&mut running.output))
    })
    .await
    .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_cli_drives_a_job_from_submit_to_its_completed_event(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let app = TestApp::spawn(pool.clone()).await;
        let url = app.url.clone();
        let stop = CancellationToken::new();
        let topic = unique("cli-events");
        create_topic(&topic, 3).await.unwrap();
        let relay = Relay::new(pool.clone(), Arc::new(SystemClock), RelaySettings::new(flotilla_tests::broker(), &topic, "cli-relay")).unwrap();
        tokio::spawn({
            let stop = stop.clone();
            async move { relay.run(stop, Duration::from_secs(5)).await }
        });

        let env = vec![
            ("FLOTILLA_URL", url.clone()),
            ("FLOTILLA_TOKEN", TEST_TOKEN.to_owned()),
            ("KAFKA_BOOTSTRAP_SERVERS", bootstrap_servers()),
            ("FLOTILLA_EVENT_TOPIC", topic.clone()),
        ];
        let definition = json!({
            "name": "approval", "input_schema": {},
            "steps": [
                {"name": "check", "target": "echo", "method": "check", "rules": ["who = input.who"]},
                {"name": "approve", "target": "echo", "method": "approve", "completion": "external"}
            ]
        });
        let s = |v: &str| v.to_owned();
        let (code, out) = flotilla(env.clone(), vec![s("workflows"), s("put"), definition.to_string()]).await;
        assert_eq!(code, Some(0), "{out:?}");
        let (code, out) = flotilla(env.clone(), vec![s("submit"), s("--workflow"), s("approval"), s("--input"), s(r#"{"who":"ada"}"#)]).await;
        assert_eq!(code, Some(0), "{out:?}");
        let job_id = out.last().unwrap().trim().to_owned();
        uuid::Uuid::parse_str(&job_id).unwrap();

        // Wait until the job parks, through `get --json`.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (code, out) = flotilla(env.clone(), vec![s("get"), job_id.clone(), s("--json")]).await;
            assert_eq!(code, Some(0), "{out:?}");
            let job: Value = serde_json::from_str(&out[0]).unwrap();
            if job["status"] == "WAITING" {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the job never parked: {job}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (code, out) = flotilla(env.clone(), vec![s("complete"), job_id.clone(), s("approve"), s(r#"{"ok":true}"#)]).await;
        assert_eq!((code, out[0].as_str()), (Some(0), "COMPLETED"), "{out:?}");
        let (code, out) = flotilla(env.clone(), vec![s("tail"), s("--job"), job_id.clone(), s("--until-terminal"), s("--timeout"), s("60s")]).await;
        assert_eq!(code, Some(0), "{out:?}");
        let kinds: Vec<&str> = out.iter().filter_map(|l| l.split_whitespace().nth(3)).collect();
        assert_eq!(kinds, ["ACCEPTED", "STEP_CHECKPOINT", "WAITING", "STEP_CHECKPOINT", "COMPLETED"], "{out:?}");

        // Exit codes scripts rely on.
        let (code, _) = flotilla(env.clone(), vec![s("get"), uuid::Uuid::new_v4().to_string()]).await;
        assert_eq!(code, Some(3), "not found");
        let (code, _) = flotilla(env.clone(), vec![s("complete"), job_id.clone(), s("check"), s("{}")]).await;
        assert_eq!(code, Some(4), "wrong state");
        let mut bad_token = env.clone();
        bad_token[1].1 = "nope".into();
        let (code, _) = flotilla(bad_token, vec![s("list")]).await;
        assert_eq!(code, Some(5), "not authorised");
        let (code, out) = flotilla(env.clone(), vec![s("list"), s("--workflow"), s("approval")]).await;
        assert_eq!(code, Some(0));
        assert!(out.iter().any(|l| l.starts_with(&job_id) && l.contains("COMPLETED")), "{out:?}");
        let (code, out) = flotilla(env.clone(), vec![s("graph"), job_id.clone()]).await;
        assert_eq!(code, Some(0), "{out:?}");
        let approve = out.iter().find(|l| l.starts_with("approve")).unwrap_or_else(|| panic!("{out:?}"));
        let columns: Vec<&str> = approve.split_whitespace().collect();
        assert_eq!(columns, ["approve", "completed", "external", "check"], "{out:?}");
        stop.cancel();
        app.stop().await;
    })
    .await
    .expect("the CLI test timed out");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_cli_signals_a_waiting_job_and_manages_a_schedule(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let app = TestApp::spawn(pool.clone()).await;
        let env = vec![
            ("FLOTILLA_URL", app.url.clone()),
            ("FLOTILLA_TOKEN", TEST_TOKEN.to_owned()),
        ];
        let s = |v: &str| v.to_owned();
        let definition = json!({
            "name": "waits", "input_schema": {},
            "steps": [{"name": "paid", "wait_for": "payment"}]
        });
        let (code, out) = flotilla(
            env.clone(),
            vec![s("workflows"), s("put"), definition.to_string()],
        )
        .await;
        assert_eq!(code, Some(0), "{out:?}");
        let (code, out) =
            flotilla(env.clone(), vec![s("submit"), s("--workflow"), s("waits")]).await;
        assert_eq!(code, Some(0), "{out:?}");
        let job_id = out.last().unwrap().trim().to_owned();

        let signal = |key: &str, amount: u32| {
            vec![
                s("signal"),
                job_id.clone(),
                s("payment"),
                format!(r#"{{"amount":{amount}}}"#),
                s("--key"),
                key.to_owned(),
            ]
        };
        let (code, out) = flotilla(env.clone(), signal("k1", 5)).await;
        assert_eq!(code, Some(0), "{out:?}");
        assert!(out[0].starts_with("signal 1 received"), "{out:?}");
        let (code, out) = flotilla(env.clone(), signal("k1", 5)).await;
        assert_eq!(
            (code, out[0].as_str()),
            (Some(0), "signal 1 already received")
        );
        let (code, _) = flotilla(env.clone(), signal("k1", 6)).await;
        assert_eq!(code, Some(4), "a conflicting repeat is a conflict");
        let (code, out) = flotilla(env.clone(), vec![s("signals"), job_id.clone()]).await;
        assert_eq!(code, Some(0));
        assert!(out.iter().any(|l| l.contains("payment")), "{out:?}");

        let (code, out) = flotilla(
            env.clone(),
            vec![
                s("schedules"),
                s("put"),
                s("nightly"),
                s("--workflow"),
                s("waits"),
                s("--cron"),
                s("0 2 * * *"),
                s("--time-zone"),
                s("Europe/Lisbon"),
            ],
        )
        .await;
        assert_eq!(code, Some(0), "{out:?}");
        let (code, out) = flotilla(env.clone(), vec![s("schedules"), s("list")]).await;
        assert_eq!(code, Some(0));
        assert!(
            out.iter()
                .any(|l| l.starts_with("nightly") && l.contains("0 2 * * * (Europe/Lisbon)")),
            "{out:?}"
        );
        let (code, out) = flotilla(
            env.clone(),
            vec![s("schedules"), s("pause"), s("nightly"), s("--json")],
        )
        .await;
        assert_eq!(code, Some(0));
        assert_eq!(
            serde_json::from_str::<Value>(&out[0]).unwrap()["paused"],
            true
        );
        let (code, _) = flotilla(
            env.clone(),
            vec![
                s("schedules"),
                s("put"),
                s("bad"),
                s("--workflow"),
                s("waits"),
                s("--every"),
                s("1ms"),
            ],
        )
        .await;
        assert_eq!(code, Some(2), "a schedule that cannot work is bad input");
        let (code, _) =
            flotilla(env.clone(), vec![s("schedules"), s("delete"), s("nightly")]).await;
        assert_eq!(code, Some(0));
        let (code, _) = flotilla(env.clone(), vec![s("schedules"), s("get"), s("nightly")]).await;
        assert_eq!(code, Some(3));
        app.stop().await;
    })
    .await
    .expect("the CLI test timed out");
}

/// `retry` and `cancel` by filter: a dry run counts, the verb acts, and a
/// job id with a filter, or neither, is a usage error.
#[sqlx::test(migrator = "MIGRATOR")]
async fn the_cli_retries_and_cancels_by_filter(pool: PgPool) {
    use flotilla_worker::engine::{RefusalMode, Submission, WorkflowRef};
    let app = TestApp::spawn_with(
        pool.clone(),
        &["--worker-count", "0"],
        flotilla_worker::test_support::echo_targets(),
    )
    .await;
    let strict = json!({"name": "strict", "input_schema": {"type": "object", "required": ["order"]},
        "steps": [{"name": "only", "target": "echo", "method": "go"}]});
    app.engine.register_workflow(&strict).await.unwrap();
    for _ in 0..30 {
        let submission = Submission {
            metadata: None,
            priority: 0,
            job_id: uuid::Uuid::new_v4(),
            workflow: WorkflowRef::Stored("strict".into()),
            input: json!({}),
            traceparent: None,
            tracestate: None,
        };
        app.engine
            .submit(submission, RefusalMode::Record)
            .await
            .unwrap();
    }
    let env = vec![
        ("FLOTILLA_URL", app.url.clone()),
        ("FLOTILLA_TOKEN", TEST_TOKEN.to_owned()),
    ];
    let args = |list: &[&str]| list.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    let (code, out) = flotilla(
        env.clone(),
        args(&[
            "retry",
            "--status",
            "FAILED",
            "--workflow",
            "strict",
            "--dry-run",
        ]),
    )
    .await;
    assert_eq!(code, Some(0), "{out:?}");
    assert!(
        out.contains(&"30 job(s) match; nothing changed (dry run)".to_owned()),
        "{out:?}"
    );
    let (code, out) = flotilla(
        env.clone(),
        args(&["retry", "--status", "FAILED", "--workflow", "strict"]),
    )
    .await;
    assert_eq!(code, Some(0), "{out:?}");
    assert!(
        out.contains(&"30 job(s) matched, 30 retry, 0 passed over".to_owned()),
        "{out:?}"
    );
    let (code, out) = flotilla(
        env.clone(),
        args(&[
            "cancel",
            "--status",
            "QUEUED",
            "--reason",
            "bad deploy",
            "--json",
        ]),
    )
    .await;
    assert_eq!(code, Some(0), "{out:?}");
    let outcome: Value =
        serde_json::from_str(out.iter().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(
        (&outcome["matched"], &outcome["changed"]),
        (&json!(30), &json!(30)),
        "{outcome}"
    );

    // Labels: given at submit, searched by list, used by a bulk filter.
    let (code, out) = flotilla(
        env.clone(),
        args(&[
            "submit",
            "--workflow",
            "strict",
            "--input",
            r#"{"order": 1}"#,
            "--metadata",
            "team=ops",
            "--metadata",
            "batch=7",
        ]),
    )
    .await;
    assert_eq!(code, Some(0), "{out:?}");
    let labelled = out.last().unwrap().trim().to_owned();
    let (code, out) = flotilla(
        env.clone(),
        args(&["list", "--metadata", "team=ops", "--json"]),
    )
    .await;
    assert_eq!(code, Some(0), "{out:?}");
    let page: Value =
        serde_json::from_str(out.iter().find(|l| l.starts_with('{')).unwrap()).unwrap();
    let listed: Vec<&str> = page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [labelled.as_str()], "{page}");
    assert_eq!(
        page["jobs"][0]["metadata"],
        json!({"batch": "7", "team": "ops"})
    );
    let (code, out) = flotilla(env.clone(), args(&["cancel", "--metadata", "team=ops"])).await;
    assert_eq!(code, Some(0), "{out:?}");
    assert!(
        out.contains(&"1 job(s) matched, 1 cancel, 0 passed over".to_owned()),
        "{out:?}"
    );
    let (code, out) = flotilla(env.clone(), args(&["list", "--metadata", "team"])).await;
    assert_eq!(code, Some(2), "not key=value: {out:?}");

    for wrong in [
        vec!["retry"],
        vec![
            "cancel",
            "8b0c6f2e-8a39-4d1e-9c39-6a7c0f1d2e3f",
            "--status",
            "QUEUED",
        ],
    ] {
        let (code, out) = flotilla(env.clone(), args(&wrong)).await;
        assert_eq!(code, Some(2), "{wrong:?}: {out:?}");
    }
    app.stop().await;
}
