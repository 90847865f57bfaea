//! `flotilla workflows`: checking definitions offline (no service at all:
//! the environment is emptied), rehearsing them against recorded answers
//! (a database only), and registering, listing and comparing versions
//! through a worker's API.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use flotilla_tests::KAFKA_TEST_TIMEOUT;
use flotilla_tests::process::Running;
use flotilla_worker::test_support::{TEST_TOKEN, TestApp};
use sqlx::PgPool;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// Runs `flotilla` with `args` and only `env` (and `PATH`) in its
/// environment; returns its exit code and output lines.
fn flotilla(env: &[(&str, String)], args: &[&str]) -> (Option<i32>, Vec<String>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (*k, v)));
    let mut running = Running::start(command);
    let status = running.wait(Duration::from_secs(60));
    (status.code(), std::mem::take(&mut running.output))
}

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn five_mistakes_are_five_problems_each_naming_its_step_and_field() {
    let dir = tempfile_dir("five-mistakes");
    // A misspelt field, a need that is no step, a `when` that is no CEL, a
    // target the fleet does not have, attempts out of bounds.
    let file = write(
        &dir,
        "orders.yaml",
        "name: orders
input_schema: {}
max_attempts: 0
steps:
  - name: fetch
    target: crm
    method: fetch
  - name: charge
    need: [fetch]
    target: billing
    method: charge
  - name: ship
    needs: [pack]
    target: crm
    method: ship
  - name: notify
    when: 'input.email =='
    target: crm
    method: notify
  - name: audit
    target: ledger
    method: audit
",
    );
    let targets = write(
        &dir,
        "targets.yaml",
        "targets:
  crm: {kind: http, base_url: 'http://127.0.0.1:1'}
  billing: {kind: http, base_url: 'http://127.0.0.1:1'}
",
    );
    let (code, out) = flotilla(
        &[],
        &["workflows", "validate", &file, "--targets", &targets],
    );
    assert_eq!(code, Some(2), "{out:#?}");
    let problems: Vec<&String> = out
        .iter()
        .filter(|line| line.starts_with(&file) && !line.ends_with("problem(s)"))
        .collect();
    assert_eq!(problems.len(), 5, "{out:#?}");
    for expected in [
        ": max_attempts: ",
        ": steps[1] (charge): need: no such field; did you mean `needs`?",
        ": steps[2] (ship): needs: ",
        ": steps[3] (notify): when: ",
        ": steps[4] (audit): target: ",
    ] {
        assert!(
            problems.iter().any(|line| line.contains(expected)),
            "no line says {expected:?}: {problems:#?}"
        );
    }
}

#[test]
fn the_demos_definitions_are_sound_for_the_demos_targets() {
    let workflows = repository().join("demo/workflows");
    let mut files: Vec<String> = std::fs::read_dir(&workflows)
        .unwrap()
        .map(|entry| entry.unwrap().path().display().to_string())
        .collect();
    files.sort();
    let targets = repository().join("demo/targets.yaml").display().to_string();
    let mut args = vec!["workflows", "validate", "--targets", &targets];
    args.extend(files.iter().map(String::as_str));
    let (code, out) = flotilla(&[], &args);
    assert_eq!(code, Some(0), "{out:#?}");
    assert_eq!(
        out.iter().filter(|line| line.ends_with(": ok")).count(),
        files.len(),
        "{out:#?}"
    );
}

#[test]
fn a_file_that_is_no_definition_is_a_problem_not_a_crash() {
    let dir = tempfile_dir("not-a-definition");
    let broken = write(&dir, "broken.json", "{\"name\": ");
    let missing = dir.path().join("missing.json").display().to_string();
    let (code, out) = flotilla(&[], &["workflows", "validate", &broken, &missing]);
    assert_eq!(code, Some(2), "{out:#?}");
    assert!(
        out.iter()
            .any(|l| l.starts_with(&broken) && l.contains("neither JSON nor YAML")),
        "{out:#?}"
    );
    assert!(
        out.iter()
            .any(|l| l.starts_with(&missing) && l.contains("cannot be read")),
        "{out:#?}"
    );
}

#[test]
fn the_schema_printed_is_the_one_published() {
    let (code, out) = flotilla(&[], &["workflows", "schema"]);
    assert_eq!(code, Some(0), "{out:#?}");
    let printed: serde_json::Value = serde_json::from_str(&out.join("\n")).unwrap();
    let published: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repository().join("schemas/workflow-definition.schema.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(printed, published);
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_yaml_definition_is_put_and_two_versions_are_listed_compared_and_submitted_to(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let app = TestApp::spawn(pool.clone()).await;
        let env = vec![
            ("FLOTILLA_URL", app.url.clone()),
            ("FLOTILLA_TOKEN", TEST_TOKEN.to_owned()),
        ];
        let dir = tempfile_dir("versions");
        let first = write(
            &dir,
            "greet.yaml",
            "name: greet\ninput_schema: {}\nsteps:\n  - name: hello\n    target: echo\n    method: hello\n",
        );
        let second = write(
            &dir,
            "greet-2.yaml",
            "name: greet\ninput_schema: {}\nsteps:\n  - name: hello\n    target: echo\n    method: hello\n  - name: goodbye\n    target: echo\n    method: goodbye\n",
        );
        let (code, out) = tokio::task::spawn_blocking({
            let env = env.clone();
            move || {
                let put = |file: &str| flotilla(&env, &["workflows", "put", &format!("@{file}")]);
                let one = put(&first);
                assert_eq!(one.0, Some(0), "{one:#?}");
                let two = put(&second);
                assert_eq!(two.0, Some(0), "{two:#?}");
                assert!(two.1.iter().any(|l| l == "greet version 2"), "{two:#?}");
                let versions = flotilla(&env, &["workflows", "versions", "greet"]);
                assert_eq!(versions.0, Some(0), "{versions:#?}");
                let listed: Vec<&str> = versions.1.iter().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
                assert_eq!(listed, ["2", "1"], "{versions:#?}");
                flotilla(&env, &["workflows", "diff", "greet", "1", "2"])
            }
        })
        .await
        .unwrap();
        assert_eq!(code, Some(0), "{out:#?}");
        assert!(out.iter().any(|l| l == "+++ greet version 2"), "{out:#?}");
        assert!(out.iter().any(|l| l.starts_with('+') && l.contains("\"goodbye\"")), "{out:#?}");
        assert!(!out.iter().any(|l| l.starts_with('-') && l.contains("\"hello\"")), "{out:#?}");

        let (code, out) = tokio::task::spawn_blocking({
            let env = env.clone();
            move || flotilla(&env, &["workflows", "diff", "greet", "1", "7"])
        })
        .await
        .unwrap();
        assert_eq!(code, Some(3), "a version that does not exist: {out:#?}");

        // A job pinned to version 1 runs it; the version must exist.
        let (pinned, missing) = tokio::task::spawn_blocking({
            let env = env.clone();
            move || {
                let submit = |version: &str| {
                    flotilla(
                        &env,
                        &["submit", "--workflow", "greet", "--workflow-version", version, "--priority", "4", "--json"],
                    )
                };
                (submit("1"), submit("7"))
            }
        })
        .await
        .unwrap();
        assert_eq!(pinned.0, Some(0), "{pinned:#?}");
        let job: serde_json::Value = serde_json::from_str(&pinned.1.join("\n")).unwrap();
        assert_eq!(job["workflow_version"], 1, "{job}");
        assert_eq!(job["priority"], 4, "{job}");
        // A retry names its version as a number or `latest`; anything else
        // is a usage error before any call, and a job that is not finished
        // for good is refused by the API with its state.
        let id = job["job_id"].as_str().unwrap().to_owned();
        let (wrong, live) = tokio::task::spawn_blocking(move || {
            let retry = |version: &str| flotilla(&env, &["retry", &id, "--workflow-version", version]);
            (retry("newest"), retry("latest"))
        })
        .await
        .unwrap();
        assert_eq!(wrong.0, Some(2), "{wrong:#?}");
        assert!(wrong.1.iter().any(|l| l.contains("neither a number nor latest")), "{wrong:#?}");
        assert_ne!(live.0, Some(0), "{live:#?}");
        assert!(live.1.iter().any(|l| l.contains("retry applies to DEAD, FAILED or CANCELLED")), "{live:#?}");
        assert_ne!(missing.0, Some(0), "{missing:#?}");
        assert!(missing.1.iter().any(|l| l.contains("has no version 7")), "{missing:#?}");
        app.stop().await;
    })
    .await
    .expect("the test ends in time");
}

/// `workflows test`'s environment: the Postgres it makes scratch databases in.
fn rehearsal_env() -> Vec<(&'static str, String)> {
    let url = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL names the Postgres the tests use (scripts/services up)");
    vec![("DATABASE_URL", url)]
}

fn demo_file(path: &str) -> String {
    repository().join(path).display().to_string()
}

#[test]
fn the_demos_payment_and_fulfilment_rehearse_the_path_the_live_demo_takes() {
    let env = rehearsal_env();
    let payment = [
        "workflows",
        "test",
        &demo_file("demo/workflows/payment.json"),
        "--responses",
        &demo_file("demo/fixtures/payment.yaml"),
    ];
    let (code, out) = flotilla(&env, &payment);
    assert_eq!(code, Some(0), "{out:#?}");
    // The retried step is called twice, after a retry on the virtual clock.
    let line = |said: &str| out.iter().position(|l| l.contains(said));
    // The pause is jittered per job: between 2.5 and 5 s after a 5 s base.
    let retried = line("retry: attempt 2 of 3 +").expect("a retry line");
    let second = line("call capture (call 2)").expect("capture's second call");
    assert!(retried < second, "{out:#?}");
    assert_eq!(
        out.iter().filter(|l| l.contains("call authorize")).count(),
        1
    );
    assert!(line("as expected").is_some(), "{out:#?}");

    let fulfilment = [
        "workflows",
        "test",
        &demo_file("demo/workflows/fulfilment.json"),
        "--responses",
        &demo_file("demo/fixtures/fulfilment.yaml"),
    ];
    let (code, out) = flotilla(&env, &fulfilment);
    assert_eq!(code, Some(0), "{out:#?}");
    assert!(
        out.iter()
            .any(|l| l.ends_with("skipped review (its when was false)")),
        "{out:#?}"
    );
    assert!(!out.iter().any(|l| l.contains("call review")), "{out:#?}");
}

#[test]
fn an_hours_timer_is_rehearsed_without_waiting_for_it() {
    let dir = tempfile_dir("rehearse-hour");
    let workflow = write(
        &dir,
        "reminder.yaml",
        "name: reminder
input_schema: {}
steps:
  - name: remind
    target: mail
    method: send
    rules: [\"to = input.to\"]
  - name: wait_an_hour
    sleep: 1h
  - name: again
    target: mail
    method: send
    rules: [\"to = input.to\"]
output: [\"sent = steps.again.sent\"]
",
    );
    let fixtures = write(
        &dir,
        "reminder-fixtures.yaml",
        "input: {to: ada@example.com}
answers:
  remind: [{answer: {sent: 1}}]
  again: [{answer: {sent: 2}}]
expect: {state: COMPLETED, result: {sent: 2}, calls: {remind: 1, again: 1}}
",
    );
    let args = ["workflows", "test", &workflow, "--responses", &fixtures];
    let env = rehearsal_env();
    // The first rehearsal on a server may build the template database.
    let (code, out) = flotilla(&env, &args);
    assert_eq!(code, Some(0), "{out:#?}");
    let wall = std::time::Instant::now();
    let (code, out) = flotilla(&env, &args);
    let wall = wall.elapsed();
    assert_eq!(code, Some(0), "{out:#?}");
    assert!(
        out.iter()
            .any(|l| l.ends_with("clock moves to +1h (nothing runs before)")),
        "{out:#?}"
    );
    assert!(
        out.iter()
            .any(|l| l == "outcome: COMPLETED after 1h of virtual time"),
        "{out:#?}"
    );
    println!("a one-hour timer rehearsed in {wall:?} of wall time");
}

#[test]
fn an_outcome_other_than_the_expected_exits_1_and_a_wrong_file_exits_2() {
    let dir = tempfile_dir("rehearse-wrong");
    let env = rehearsal_env();
    let payment = demo_file("demo/workflows/payment.json");
    let fixtures = std::fs::read_to_string(demo_file("demo/fixtures/payment.yaml")).unwrap();
    // The demo's payment fixtures with `from` replaced by `to`, rehearsed.
    let rehearse_changed = |name: &str, from: &str, to: &str| {
        let changed = write(&dir, name, &fixtures.replace(from, to));
        let (code, out) = flotilla(
            &env,
            &["workflows", "test", &payment, "--responses", &changed],
        );
        (code, out, changed)
    };
    let (code, out, failed) = rehearse_changed("failed.yaml", "state: COMPLETED", "state: FAILED");
    assert_eq!(code, Some(1), "{out:#?}");
    assert!(
        out.iter()
            .any(|l| l == "not as expected: state: expected FAILED, got COMPLETED"),
        "{out:#?}"
    );
    let (code, out, _) = rehearse_changed("misspelt.yaml", "answers:", "answer:");
    assert_eq!(code, Some(2), "{out:#?}");
    assert!(
        out.iter().any(|l| l.contains("unknown field `answer`")),
        "{out:#?}"
    );
    // Without a database it cannot run, and says what it needs.
    let (code, out) = flotilla(
        &[],
        &["workflows", "test", &payment, "--responses", &failed],
    );
    assert_eq!(code, Some(2), "{out:#?}");
    assert!(out.iter().any(|l| l.contains("--database-url")), "{out:#?}");
}

/// A directory of this test's own, removed when the test ends.
fn tempfile_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("flotilla-cli-{name}."))
        .tempdir()
        .unwrap()
}
