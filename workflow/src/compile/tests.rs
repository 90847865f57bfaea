//! The compiler's tests: every problem named by its step and field.
use super::*;
use crate::limits::{MAX_RULES, MAX_VIOLATIONS};

fn definition(input_schema: &Json) -> Json {
    serde_json::json!({
        "name": "w",
        "input_schema": input_schema,
        "steps": [{"name": "s", "target": "t", "method": "m"}]
    })
}

fn compile(document: &Json) -> Result<CompiledWorkflow, InvalidDefinition> {
    CompiledWorkflow::compile(document, &["t".to_owned()].into())
}

/// `^(a+)+$` against `aaaa…a!` takes a backtracking engine exponential
/// time; the linear-time engine answers at once (the test's own
/// timeout is the bound).
#[test]
fn a_catastrophic_pattern_validates_in_linear_time() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "s": {"type": "string", "pattern": "^(a+)+$"},
            "m": {"type": "object", "patternProperties": {"^(x+x+)+y$": {"type": "integer"}}}
        }
    });
    let compiled = compile(&definition(&schema)).unwrap();
    let hostile = format!("{}!", "a".repeat(100_000));
    let key = format!("{}z", "x".repeat(10_000));
    let input = serde_json::json!({"s": hostile, "m": {key: "not checked"}});
    let violations = compiled.check_input(&input).unwrap_err();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].starts_with("/s:"), "{violations:?}");
}

#[test]
fn a_pattern_that_needs_backtracking_is_refused_at_registration() {
    for pattern in [r"^(a)\1$", "^(?=a)a$", "^(?<!b)a$"] {
        let schema = serde_json::json!({"type": "string", "pattern": pattern});
        let refused = compile(&definition(&schema)).unwrap_err();
        assert_eq!(refused.problems[0].field, "input_schema", "{pattern}");
    }
}

#[test]
fn violations_are_listed_up_to_the_cap() {
    let schema = serde_json::json!({"type": "array", "items": {"type": "integer"}});
    let compiled = compile(&definition(&schema)).unwrap();
    let input = serde_json::json!(vec!["x"; 1000]);
    let violations = compiled.check_input(&input).unwrap_err();
    assert_eq!(violations.len(), MAX_VIOLATIONS + 1);
    assert!(violations[MAX_VIOLATIONS].contains("more violations"));
}

#[test]
fn a_definition_over_its_limits_is_refused_naming_each() {
    let step =
        |i: usize| serde_json::json!({"name": format!("s{i}"), "target": "t", "method": "m"});
    let many_steps = serde_json::json!({
        "name": "w", "input_schema": {},
        "steps": (0..=MAX_STEPS).map(step).collect::<Vec<_>>()
    });
    let refused = compile(&many_steps).unwrap_err();
    assert!(
        refused.problems.iter().any(|p| p.field == "steps"),
        "{refused}"
    );

    let many_rules = serde_json::json!({
        "name": "w", "input_schema": {},
        "steps": [{"name": "s", "target": "t", "method": "m",
            "rules": (0..=MAX_RULES).map(|i| format!("f{i} = 1")).collect::<Vec<_>>()}]
    });
    let refused = compile(&many_rules).unwrap_err();
    assert!(
        refused
            .problems
            .iter()
            .any(|p| p.field == "rules and validate"),
        "{refused}"
    );

    let huge_schema = serde_json::json!({"description": "d".repeat(limits::MAX_SCHEMA_BYTES)});
    let refused = compile(&definition(&huge_schema)).unwrap_err();
    assert_eq!(refused.problems[0].field, "input_schema", "{refused}");
}

fn graph(steps: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({"name": "w", "input_schema": {}, "steps": steps})
}

fn problems(refused: &InvalidDefinition) -> Vec<(String, String, String)> {
    refused
        .problems
        .iter()
        .map(|p| {
            (
                p.step.clone().unwrap_or_default(),
                p.field.clone(),
                p.message.clone(),
            )
        })
        .collect()
}

/// A list written before graphs keeps its meaning: each step reads
/// every earlier one, as a chain.
#[test]
fn a_list_reads_every_earlier_step() {
    let compiled = compile(&graph(&serde_json::json!([
        {"name": "a", "target": "t", "method": "m"},
        {"name": "b", "target": "t", "method": "m"},
        {"name": "c", "target": "t", "method": "m",
         "rules": ["x = steps.a.n + steps['b'].n"], "when": "has(steps.a)"},
    ])))
    .unwrap();
    assert!(compiled.graph.is_chain());
}

#[test]
fn an_expression_naming_a_step_it_does_not_need_is_refused_naming_both() {
    let refused = compile(&graph(&serde_json::json!([
        {"name": "a", "target": "t", "method": "m", "needs": []},
        {"name": "b", "target": "t", "method": "m", "needs": []},
        {"name": "c", "target": "t", "method": "m", "needs": ["a"],
         "rules": ["x = steps.a.n", "y = steps.b.n"], "validate": ["steps.ghost.ok"],
         "when": "steps.c.n > 1"},
    ])))
    .unwrap_err();
    assert_eq!(
        problems(&refused),
        [
            ("c".into(), "rules[1]".into(), "reads steps.b, which it does not need (a step reads only the steps that end before it: add it to needs)".into()),
            ("c".into(), "validate[0]".into(), "reads steps.ghost, which is no step".into()),
            ("c".into(), "when".into(), "reads steps.c, which it does not need (a step reads only the steps that end before it: add it to needs)".into()),
        ]
    );
}

#[test]
fn cycles_bad_needs_a_when_that_is_no_boolean_and_parallelism_out_of_range_are_refused() {
    let mut definition = graph(&serde_json::json!([
        {"name": "a", "target": "t", "method": "m", "needs": ["b"]},
        {"name": "b", "target": "t", "method": "m", "needs": ["a"]},
        {"name": "c", "target": "t", "method": "m", "needs": ["nowhere"], "when": "input.n + 1"},
        {"name": "d", "target": "t", "method": "m", "needs": [], "when": "input.n >"},
        {"name": "e".repeat(129), "target": "t", "method": "m", "needs": []},
        {"name": "nap", "sleep": "soon", "needs": []},
        {"name": "each", "target": "t", "method": "m", "needs": [], "for_each": "input.n > 1", "max_items": 0},
        {"name": "wait", "until": "input.at", "sleep": "0s", "target": "t", "needs": []},
    ]));
    definition["parallelism"] = serde_json::json!(0);
    let refused = compile(&definition).unwrap_err();
    let found = problems(&refused);
    for expected in [
        ("", "parallelism", "must be 1 to 64, got 0"),
        ("a", "needs", "is on a cycle of needs"),
        ("b", "needs", "is on a cycle of needs"),
        ("c", "needs", "needs \"nowhere\", which is no step"),
        ("c", "when", "is arithmetic, not a boolean"),
        (
            &"e".repeat(129),
            "name",
            "129 bytes long, over the limit of 128",
        ),
    ] {
        assert!(
            found.contains(&(expected.0.into(), expected.1.into(), expected.2.into())),
            "{expected:?} not in {found:?}"
        );
    }
    for (at, field, starts) in [
        ("d", "when", "CEL does not compile"),
        ("nap", "sleep", "not a duration such as 30m or 2s"),
    ] {
        assert!(
            found
                .iter()
                .any(|(step, f, message)| step == at && f == field && message.starts_with(starts)),
            "{at} {field} {starts}: {found:?}"
        );
    }
}

#[test]
fn a_misspelt_field_is_named_with_the_one_meant_beside_every_other_problem() {
    let document = serde_json::json!({
        "name": "w", "input_schema": {}, "max_attempts": 0, "retries": 3,
        "steps": [
            {"name": "a", "target": "t", "method": "m"},
            {"name": "b", "need": ["a"], "target": "t", "method": "m"},
            {"name": "c", "target": "t", "method": "m", "start": {"workflow": "x", "inptu": []}}
        ]
    });
    let refused = compile(&document).unwrap_err();
    let found = problems(&refused);
    for (step, field, message) in [
        ("", "retries", "no such field (the fields here:"),
        ("b", "need", "no such field; did you mean `needs`?"),
        (
            "c",
            "start.inptu",
            "no such field; did you mean `start.input`?",
        ),
        ("", "max_attempts", "must be"),
    ] {
        assert!(
            found
                .iter()
                .any(|(s, f, m)| s == step && f == field && m.starts_with(message)),
            "no {step}/{field}/{message}: {found:#?}"
        );
    }
}

#[test]
fn a_document_of_the_wrong_shape_lists_every_place_it_is_wrong() {
    let document = serde_json::json!({
        "name": "w", "input_schema": {}, "parallelism": "8",
        "steps": [{"name": "a", "needs": "b", "target": "t", "method": "m"}]
    });
    let found = problems(&compile(&document).unwrap_err());
    assert!(
        found
            .iter()
            .any(|(s, f, _)| s.is_empty() && f == "parallelism"),
        "{found:#?}"
    );
    assert!(
        found.iter().any(|(s, f, _)| s == "a" && f == "needs"),
        "{found:#?}"
    );
}

/// Retry policies and wait bounds are checked where they are written: a
/// policy's field out of bounds, `on_timeout` on a call or without a
/// `timeout_ms`, an execution timeout past 366 days; a step's policy is
/// resolved over the workflow's.
#[test]
fn retry_policies_and_wait_bounds_are_checked_and_resolved() {
    let document = serde_json::json!({
        "name": "w", "input_schema": {}, "execution_timeout_ms": 40_000_000_000u64,
        "retry": {"coefficient": 20},
        "steps": [
            {"name": "call", "target": "t", "method": "m", "timeout_ms": 5, "on_timeout": "skip",
             "retry": {"never_on": ["sometimes"]}},
            {"name": "wait", "wait_for": "go", "on_timeout": "fail"},
            {"name": "bounded", "wait_for": "go", "timeout_ms": 60_000, "on_timeout": {"value": 1}}
        ]
    });
    let found = problems(&compile(&document).unwrap_err());
    let fields: Vec<(&str, &str)> = found
        .iter()
        .map(|(step, field, _)| (step.as_str(), field.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            ("", "execution_timeout_ms"),
            ("call", "on_timeout"),
            ("wait", "on_timeout"),
            ("", "retry.coefficient"),
            ("call", "retry.never_on"),
        ],
        "{found:?}"
    );
    let fine = serde_json::json!({
        "name": "w", "input_schema": {}, "max_attempts": 4,
        "retry": {"initial_interval": "2s", "jitter": false},
        "steps": [
            {"name": "a", "target": "t", "method": "m", "retry": {"attempts": 9, "retry_on": [500]}},
            {"name": "b", "target": "t", "method": "m"}
        ]
    });
    let compiled = compile(&fine).unwrap();
    let (a, b) = (&compiled.steps[0].retry, &compiled.steps[1].retry);
    assert_eq!((a.attempts, b.attempts), (9, 4));
    assert_eq!(a.retry_statuses, vec![500]);
    assert!(b.retry_statuses.is_empty());
    assert_eq!(b.initial_interval, Some(std::time::Duration::from_secs(2)));
    assert!(!a.jitter && !b.jitter);
}

/// A call shape is a call's, its templates read only the steps it needs,
/// and its problems are named by field.
#[test]
fn a_call_shape_belongs_to_a_call_and_reads_only_its_needs() {
    let document = serde_json::json!({
        "name": "w", "input_schema": {},
        "steps": [
            {"name": "a", "target": "t", "method": "m"},
            {"name": "b", "target": "t", "needs": [], "verb": "GET",
             "path": "/x/{steps.a.id}"},
            {"name": "wait", "sleep": "1s", "verb": "GET"},
            {"name": "c", "target": "t", "path": "/../up"}
        ]
    });
    let problems = compile(&document).unwrap_err().problems;
    let named = |step: &str, field: &str| {
        problems
            .iter()
            .any(|p| p.step.as_deref() == Some(step) && p.field == field)
    };
    assert!(
        named("b", "path"),
        "b reads a step it does not need: {problems:?}"
    );
    assert!(named("wait", "verb"), "{problems:?}");
    assert!(named("c", "path"), "{problems:?}");
    assert!(
        !named("c", "method"),
        "a path stands for the method: {problems:?}"
    );
    let fine = serde_json::json!({
        "name": "w", "input_schema": {},
        "steps": [
            {"name": "a", "target": "t", "method": "m"},
            {"name": "b", "target": "t", "verb": "DELETE", "path": "/x/{steps.a.id}",
             "headers": {"X-Key": "{secrets.k}"}}
        ]
    });
    let compiled = compile(&fine).unwrap();
    assert!(compiled.steps[1].call_shape.is_some());
    assert!(compiled.steps[0].call_shape.is_none());
}

/// A repeat is a plain call's, its pauses and span in bounds, its `until`
/// a boolean over what it may read; a repeat without `for` is no repeat.
#[test]
fn a_repeat_is_bounded_and_belongs_to_a_plain_call() {
    let with = |repeat: Json, extra: Json| {
        let mut step =
            serde_json::json!({"name": "poll", "target": "t", "method": "m", "repeat": repeat});
        step.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        compile(&serde_json::json!({"name": "w", "input_schema": {}, "steps": [step]}))
    };
    let fine = serde_json::json!({"until": "response.ready", "every": "30s", "for": "1h"});
    let compiled = with(fine.clone(), serde_json::json!({"on_timeout": "skip"})).unwrap();
    let repeat = compiled.steps[0].repeat.as_ref().unwrap();
    assert_eq!(repeat.every, std::time::Duration::from_secs(30));
    assert_eq!(repeat.for_at_most, std::time::Duration::from_secs(3600));
    for (repeat, extra, field, says) in [
        (
            serde_json::json!({"until": "true", "every": "30s"}),
            serde_json::json!({}),
            "repeat",
            "\"for\" is a required",
        ),
        (
            serde_json::json!({"until": "'yes'", "every": "30s", "for": "1h"}),
            serde_json::json!({}),
            "repeat.until",
            "not a boolean",
        ),
        (
            serde_json::json!({"until": "true", "every": "10ms", "for": "1h"}),
            serde_json::json!({}),
            "repeat.every",
            "1 second",
        ),
        (
            serde_json::json!({"until": "true", "every": "1m", "for": "30s"}),
            serde_json::json!({}),
            "repeat.for",
            "shorter",
        ),
        (
            serde_json::json!({"until": "true", "every": "1s", "for": "30d"}),
            serde_json::json!({}),
            "repeat.for",
            "10000 pauses",
        ),
        (
            serde_json::json!({"until": "true", "every": "soon", "for": "1h"}),
            serde_json::json!({}),
            "repeat.every",
            "not a duration",
        ),
        (
            serde_json::json!({"until": "steps.other.x", "every": "1s", "for": "1h"}),
            serde_json::json!({}),
            "repeat.until",
            "no step",
        ),
        (
            fine.clone(),
            serde_json::json!({"paged": true}),
            "repeat",
            "plain call",
        ),
        (
            fine.clone(),
            serde_json::json!({"for_each": "[1]"}),
            "repeat",
            "plain call",
        ),
    ] {
        let problems = with(repeat.clone(), extra).unwrap_err().problems;
        assert!(
            problems
                .iter()
                .any(|p| p.field.starts_with(field) && p.message.contains(says)),
            "{repeat}: {problems:?}"
        );
    }
}

/// A `start` step may run per item, unbounded in time: its children are.
#[test]
fn a_start_step_runs_per_item_without_a_timeout_of_its_own() {
    let step = |extra: Json| {
        let mut step = serde_json::json!({"name": "each", "for_each": "input.lines",
            "start": {"workflow": "child", "input": ["sku = item"]}});
        step.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        compile(&serde_json::json!({"name": "w", "input_schema": {}, "steps": [step]}))
    };
    assert!(step(serde_json::json!({})).is_ok());
    let problems = step(serde_json::json!({"timeout_ms": 1000}))
        .unwrap_err()
        .problems;
    assert!(
        problems
            .iter()
            .any(|p| p.field == "timeout_ms" && p.message.contains("execution_timeout_ms")),
        "{problems:?}"
    );
    let problems = step(serde_json::json!({"paged": true}))
        .unwrap_err()
        .problems;
    assert!(problems.iter().any(|p| p.field == "paged"), "{problems:?}");
}
