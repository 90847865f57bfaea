//! Rehearsals of the demo's workflows and of one that waits for everything
//! a workflow can wait for, in scratch databases beside `DATABASE_URL`.

use std::path::Path;
use std::time::{Duration, Instant};

use flotilla_demo::driver::samples::Kind;
use flotilla_rehearsal::{Fixtures, Rehearsal, RehearsalError, rehearse};
use serde_json::{Value, json};

/// A rehearsal that hangs fails here rather than at the suite's limit.
const LIMIT: Duration = Duration::from_secs(60);

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .expect("DATABASE_URL names the Postgres the tests use (scripts/services up)")
}

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn demo(name: &str) -> (Value, Fixtures) {
    let read = |path: &str| std::fs::read_to_string(repository().join(path)).unwrap();
    let definition =
        flotilla_workflow::read_document(&read(&format!("demo/workflows/{name}.json"))).unwrap();
    let fixtures = Fixtures::parse(&read(&format!("demo/fixtures/{name}.yaml"))).unwrap();
    (definition, fixtures)
}

async fn rehearsed(
    definitions: &[Value],
    fixtures: &Fixtures,
) -> Result<Rehearsal, RehearsalError> {
    tokio::time::timeout(LIMIT, rehearse(&database_url(), definitions, fixtures))
        .await
        .expect("the rehearsal finished within its limit")
}

fn lines(rehearsal: &Rehearsal) -> Vec<String> {
    rehearsal.lines.iter().map(|l| l.text.clone()).collect()
}

/// The calls the live demo's driver holds each job of `kind` to, as
/// `step` or `step:part`.
fn live_demo_calls(kind: Kind) -> Vec<(String, usize)> {
    kind.expected_calls()
        .unwrap()
        .iter()
        .map(|(key, n)| ((*key).to_owned(), usize::try_from(*n).unwrap()))
        .collect()
}

/// Rehearses the demo's `name` with its fixtures: the outcome is the one
/// they expect, and the calls those the live demo makes for `kind`.
async fn rehearse_demo(name: &str, kind: Kind) -> Rehearsal {
    let (definition, fixtures) = demo(name);
    let rehearsal = rehearsed(&[definition], &fixtures).await.unwrap();
    assert_eq!(
        rehearsal.mismatches(fixtures.expect.as_ref()),
        Vec::<String>::new()
    );
    for (key, calls) in live_demo_calls(kind) {
        assert_eq!(rehearsal.calls_by_part.get(&key), Some(&calls), "{key}");
    }
    rehearsal
}

#[tokio::test]
async fn the_payment_retries_capture_once_as_the_live_demo_does() {
    let rehearsal = rehearse_demo("payment", Kind::Retried).await;
    let path = lines(&rehearsal);
    let retry = path
        .iter()
        .position(|l| l.starts_with("retry: attempt 2 of 3"))
        .unwrap();
    let second = path
        .iter()
        .position(|l| l.starts_with("call capture (call 2)"))
        .unwrap();
    assert!(retry < second, "{path:#?}");
    // The backoff was waited on the virtual clock.
    assert!(
        path.iter().any(|l| l.starts_with("clock moves to")),
        "{path:#?}"
    );
    assert!(rehearsal.elapsed > Duration::ZERO);
}

#[tokio::test]
async fn the_fulfilment_of_three_lines_skips_its_review_and_sleeps_its_timer() {
    let rehearsal = rehearse_demo("fulfilment", Kind::Graph).await;
    let path = lines(&rehearsal);
    assert!(
        path.contains(&"skipped review (its when was false)".to_owned()),
        "{path:#?}"
    );
    assert!(
        path.contains(&"sleeping at cool_off until +1s".to_owned()),
        "{path:#?}"
    );
    assert_eq!(rehearsal.skipped, vec!["review".to_owned()]);
}

/// Every kind of wait: a call, an hour's timer, a signal, a person's
/// answer, a child (stood in), a call; compensation on failure.
fn claim() -> Value {
    json!({
        "name": "claim", "input_schema": {}, "max_attempts": 3,
        "steps": [
            {"name": "open", "target": "desk", "method": "open", "rules": ["who = input.name"]},
            {"name": "cool", "needs": ["open"], "sleep": "1h"},
            {"name": "approval", "needs": ["cool"], "wait_for": "approved"},
            {"name": "review", "needs": ["approval"], "target": "desk", "method": "review",
             "completion": "external"},
            {"name": "ship", "needs": ["review"],
             "start": {"workflow": "shipping", "input": ["to = input.name"]}},
            {"name": "close", "needs": ["ship"], "target": "desk", "method": "close",
             "rules": ["label = steps.ship.label"]}
        ],
        "on_failure": [{"name": "undo", "target": "desk", "method": "undo",
                        "rules": ["why = failure.error"]}],
        "output": ["label = steps.close.label", "approved_by = steps.approval.by"]
    })
}

fn claim_fixtures(close: &str) -> Fixtures {
    Fixtures::parse(&format!(
        "input: {{name: ada}}
answers:
  open: [{{answer: {{opened: true}}}}]
  close: [{close}]
  undo: [{{answer: {{undone: true}}}}]
signals: {{approved: {{by: grace}}}}
completions: {{review: {{ok: true}}}}
children: {{ship: {{result: {{label: PARCEL-1}}}}}}
"
    ))
    .unwrap()
}

#[tokio::test]
async fn an_hours_timer_a_signal_a_persons_answer_and_a_child_take_no_wall_time() {
    let wall = Instant::now();
    let rehearsal = rehearsed(&[claim()], &claim_fixtures("{answer: {label: PARCEL-1}}"))
        .await
        .unwrap();
    let wall = wall.elapsed();
    println!("{}", rehearsal.render());
    println!("virtual {:?} in wall {wall:?}", rehearsal.elapsed);
    assert_eq!(
        rehearsal.state.as_str(),
        "COMPLETED",
        "{}",
        rehearsal.render()
    );
    assert_eq!(
        rehearsal.result,
        Some(json!({"label": "PARCEL-1", "approved_by": "grace"}))
    );
    assert!(rehearsal.elapsed >= Duration::from_secs(3600));
    // An hour on the engine's clock, not the machine's: far below it.
    assert!(wall < Duration::from_secs(60), "{wall:?}");
    let path = lines(&rehearsal);
    for said in [
        "sleeping at cool until +1h",
        "given signal approved {\"by\":\"grace\"}",
        "given the answer of review {\"ok\":true}",
    ] {
        assert!(path.contains(&said.to_owned()), "{said}: {path:#?}");
    }
    assert!(
        rehearsal
            .lines
            .iter()
            .any(|l| l.child.as_deref() == Some("shipping")),
        "{path:#?}"
    );
    assert_eq!(rehearsal.calls.get("undo"), None);
}

#[tokio::test]
async fn a_500_fails_the_job_and_its_compensation_runs() {
    let fixtures = claim_fixtures("{status: 500, body: {error: boom}}");
    let rehearsal = rehearsed(&[claim()], &fixtures).await.unwrap();
    assert_eq!(rehearsal.state.as_str(), "FAILED", "{}", rehearsal.render());
    assert_eq!(rehearsal.calls.get("close"), Some(&1));
    assert_eq!(rehearsal.calls.get("undo"), Some(&1));
    let expect = Fixtures::parse("expect: {state: COMPLETED, calls: {undo: 0}}").unwrap();
    let differ = rehearsal.mismatches(expect.expect.as_ref());
    assert_eq!(differ.len(), 2, "{differ:?}");
    assert!(
        differ[0].contains("expected COMPLETED, got FAILED"),
        "{differ:?}"
    );
}

#[tokio::test]
async fn a_wait_the_fixtures_never_answer_stalls_and_says_where() {
    let mut fixtures = claim_fixtures("{answer: {label: PARCEL-1}}");
    fixtures.signals.clear();
    let rehearsal = rehearsed(&[claim()], &fixtures).await.unwrap();
    assert_eq!(rehearsal.state.as_str(), "WAITING");
    let differ = rehearsal.mismatches(None);
    assert_eq!(differ.len(), 1, "{differ:?}");
    assert!(differ[0].contains("waits at step approval"), "{differ:?}");
}

#[tokio::test]
async fn a_step_without_answers_is_named_and_attempts_run_out() {
    let (definition, mut fixtures) = demo("payment");
    fixtures.answers.remove("capture");
    fixtures.expect = None;
    let rehearsal = rehearsed(&[definition], &fixtures).await.unwrap();
    // A missing answer is taken as a defect: the job fails at once.
    assert_eq!(rehearsal.state.as_str(), "FAILED");
    let differ = rehearsal.mismatches(None);
    assert!(
        differ.iter().any(|d| d.contains("answers.capture")),
        "{differ:?}"
    );

    let (definition, mut fixtures) = demo("payment");
    fixtures.answers.insert(
        "capture".to_owned(),
        Fixtures::parse("answers: {capture: [{unreachable: connection refused}]}")
            .unwrap()
            .answers["capture"]
            .clone(),
    );
    let rehearsal = rehearsed(&[definition], &fixtures).await.unwrap();
    assert_eq!(rehearsal.state.as_str(), "DEAD", "{}", rehearsal.render());
    assert_eq!(rehearsal.calls.get("capture"), Some(&3));
}

#[tokio::test]
async fn wrong_files_are_refused_before_anything_runs() {
    let (definition, _) = demo("payment");
    let cases: [(Vec<Value>, &str, &str); 4] = [
        (
            vec![definition.clone()],
            "workflow: billing",
            "not among the definitions",
        ),
        (vec![claim()], "children: {}", "give its definition too"),
        (
            vec![definition.clone()],
            "children: {ship: {verdict: no}}",
            "no step of that name starts",
        ),
        (vec![definition.clone()], "input: {amount: 0}", "input:"),
    ];
    for (definitions, text, said) in cases {
        let wrong = Fixtures::parse(text).unwrap();
        let refused = rehearsed(&definitions, &wrong).await.unwrap_err();
        assert!(matches!(refused, RehearsalError::Fixtures(_)), "{refused}");
        assert!(refused.to_string().contains(said), "{text}: {refused}");
    }
}

#[tokio::test]
async fn a_503_asking_to_retry_after_two_minutes_is_retried_two_minutes_later() {
    let (definition, mut fixtures) = demo("payment");
    fixtures.answers.insert(
        "capture".to_owned(),
        Fixtures::parse(
            "answers: {capture: [{status: 503, retry_after: \"120\"}, {answer: {captured: 100}}]}",
        )
        .unwrap()
        .answers["capture"]
            .clone(),
    );
    let rehearsal = rehearsed(std::slice::from_ref(&definition), &fixtures)
        .await
        .unwrap();
    let path = lines(&rehearsal);
    assert!(
        path.iter()
            .any(|l| l.contains("retryable (status, retry after 2m)")),
        "{path:#?}"
    );
    assert!(
        path.iter()
            .any(|l| l.starts_with("retry: attempt 2 of 3 +2m:")),
        "{path:#?}"
    );
    assert_eq!(rehearsal.state.as_str(), "COMPLETED");
    // The same files take the same path, jitter included.
    let again = rehearsed(&[definition], &fixtures).await.unwrap();
    assert_eq!(again.lines, rehearsal.lines);
}

/// A poll and a child per item rehearse as they run: the poll's pauses on
/// the engine's clock, each item's child stood in.
#[tokio::test]
async fn a_poll_and_a_child_per_item_rehearse_without_wall_time() {
    let definition = json!({
        "name": "restock", "input_schema": {},
        "steps": [
            {"name": "export", "target": "stock", "verb": "GET", "path": "/exports/{input.id}",
             "repeat": {"until": "response.ready", "every": "10m", "for": "1h"}},
            {"name": "lines", "for_each": "input.skus",
             "start": {"workflow": "shipping", "input": ["name = item"]}}
        ],
        "output": ["labels = steps.lines.map(l, l.label)", "rows = steps.export.rows"]
    });
    let fixtures = Fixtures::parse(
        "input: {id: x, skus: [a, b]}
answers:
  export: [{answer: {ready: false}}, {answer: {ready: false}}, {answer: {ready: true, rows: 3}}]
children: {lines: {result: {label: L}}}
",
    )
    .unwrap();
    let rehearsal = rehearsed(&[definition], &fixtures).await.unwrap();
    assert_eq!(
        rehearsal.state.as_str(),
        "COMPLETED",
        "{}",
        rehearsal.render()
    );
    assert_eq!(
        rehearsal.result,
        Some(json!({"labels": ["L", "L"], "rows": 3}))
    );
    assert_eq!(rehearsal.calls.get("export"), Some(&3));
    assert!(
        rehearsal.elapsed >= Duration::from_secs(20 * 60),
        "two pauses"
    );
}
