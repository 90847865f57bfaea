//! A fuzz pass over what users write: workflow definitions and the CEL
//! expressions in them. Structure-aware documents and expressions never
//! panic the compiler or the evaluator; every refusal names its problem.
//! `FLOTILLA_FUZZ_CASES` sets the cases per property (CI runs the default).

use std::collections::HashSet;

use flotilla_worker::workflow::CompiledWorkflow;
use flotilla_worker::workflow::expr::{Expression, Scope};
use proptest::prelude::*;
use serde_json::{Value, json};

fn cases() -> ProptestConfig {
    let cases = std::env::var("FLOTILLA_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256);
    ProptestConfig::with_cases(cases)
}

/// CEL-shaped text: identifiers, paths, literals, operators, calls, brackets.
fn cel_source() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("input".to_owned()),
        Just("steps".to_owned()),
        Just("response".to_owned()),
        Just("result".to_owned()),
        "[a-z_]{1,6}",
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        ".{0,6}".prop_map(|s| format!("{s:?}")),
        prop::sample::select(vec![
            ".",
            "+",
            "-",
            "*",
            "/",
            "%",
            "==",
            "!=",
            "<",
            ">=",
            "&&",
            "||",
            "!",
            "?",
            ":",
            "(",
            ")",
            "[",
            "]",
            "{",
            "}",
            ",",
            "size(",
            "has(",
            "int(",
            "string(",
            "double(",
            "in",
            "true",
            "false",
            "null",
            "'",
            "\"",
            " ",
            "matches(",
            "startsWith(",
            ".map(x,",
            ".all(x,",
        ])
        .prop_map(str::to_owned),
    ];
    prop::collection::vec(token, 1..24).prop_map(|tokens| tokens.concat())
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Into::into)),
        ".{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{1,5}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A JSON Schema, mostly well-formed, sometimes not.
fn schema() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({})),
        Just(
            json!({"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}})
        ),
        Just(json!({"type": "string", "pattern": "^[a-z]+$"})),
        Just(json!({"type": "wat"})),
        Just(json!({"pattern": "("})),
        any_json(),
    ]
}

fn step() -> impl Strategy<Value = Value> {
    (
        "[a-z]{1,4}",
        prop::sample::select(vec!["echo", "missing", ""]),
        prop::collection::vec((prop_oneof!["[a-z.]{0,6}", ".{0,4}"], cel_source()), 0..3),
        prop::collection::vec(cel_source(), 0..2),
        prop::option::of(schema()),
        prop::option::of(prop::sample::select(vec!["external", "inline", ""])),
        prop::option::of(any_json()),
    )
        .prop_map(|(name, target, rules, validate, output_schema, completion, timeout)| {
            let rules: Vec<String> = rules.into_iter().map(|(path, e)| format!("{path} = {e}")).collect();
            let mut step = json!({"name": name, "target": target, "method": "m", "rules": rules, "validate": validate});
            if let Some(schema) = output_schema {
                step["output_schema"] = schema;
            }
            if let Some(completion) = completion {
                step["completion"] = json!(completion);
            }
            if let Some(timeout) = timeout {
                step["timeout_ms"] = timeout;
            }
            step
        })
}

fn definition() -> impl Strategy<Value = Value> {
    (
        prop_oneof!["[a-z]{1,8}".prop_map(Value::from), any_json()],
        schema(),
        prop::collection::vec(step(), 0..4),
        prop::option::of(cel_source()),
        prop::option::of(any_json()),
        prop::option::of(any_json()),
    )
        .prop_map(|(name, input_schema, steps, verdict, deadline, attempts)| {
            let mut doc = json!({"name": name, "input_schema": input_schema, "steps": steps});
            if let Some(verdict) = verdict {
                doc["verdict"] = json!(verdict);
            }
            if let Some(deadline) = deadline {
                doc["deadline_ms"] = deadline;
            }
            if let Some(attempts) = attempts {
                doc["max_attempts"] = attempts;
            }
            doc
        })
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn definitions_compile_or_are_refused_with_every_problem_named(document in definition()) {
        let targets: HashSet<String> = ["echo".to_owned()].into();
        if let Err(invalid) = CompiledWorkflow::compile(&document, &targets) {
            prop_assert!(!invalid.problems.is_empty());
            prop_assert!(invalid.problems.iter().all(|p| !p.message.is_empty()));
        }
    }

    #[test]
    fn cel_expressions_compile_and_evaluate_without_panicking(
        source in cel_source(),
        input in any_json(),
        steps in any_json(),
        response in any_json(),
    ) {
        if let Ok(expression) = Expression::compile(&source) {
            let scope = Scope::default()
                .with("input", &input)
                .with("steps", &steps)
                .with("response", &response);
            let _ = expression.evaluate(&scope);
            let _ = expression.evaluate_bool(&scope);
        }
    }
}
