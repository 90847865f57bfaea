//! What one definition may hold. Every token holder with the `define`
//! scope (and, for inline definitions, every submitter with it) hands the
//! fleet code to run with the workers' credentials, so a definition is
//! bounded in what it holds and where its calls may go; the budget of a
//! single evaluation is `budget.rs`.

use serde_json::Value as Json;

/// Steps in one workflow.
pub const MAX_STEPS: usize = 999;
/// `start` steps in one workflow: each starts a child, which may start
/// its own; the family's bound (`FLOTILLA_MAX_FAMILY_JOBS`) stops the
/// whole tree, this keeps one definition from spending it at once.
pub const MAX_START_STEPS: usize = 64;
/// Bytes of one step's name (names key checkpoints, events and graphs).
pub const MAX_STEP_NAME_BYTES: usize = 128;
/// The longest signal name a `wait_for` may wait for, in bytes.
pub const MAX_SIGNAL_NAME_BYTES: usize = 128;
/// Rules (request assignments) plus `validate` expressions of one step, and
/// output assignments of a workflow.
pub const MAX_RULES: usize = 100;
/// The serialized size of one JSON Schema (`input_schema`, a step's
/// `output_schema`).
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// The length of a step's `method`.
pub const MAX_METHOD_CHARS: usize = 128;
/// Violations reported for one document: a schema that fails everywhere
/// over a large document stops here.
pub const MAX_VIOLATIONS: usize = 20;
/// What one compiled `pattern` (or `patternProperties` key) may take in
/// memory. Patterns compile with the `regex` crate, whose matching time
/// is linear in the text: no backtracking, so no catastrophic pattern;
/// look-around and back-references are refused at registration.
pub const PATTERN_SIZE_LIMIT: usize = 256 * 1024;
/// Patterns in all the schemas of one definition: each compiles to up to
/// [`PATTERN_SIZE_LIMIT`] (a short `\w{40}` takes hundreds of KiB).
pub const MAX_PATTERNS: usize = 64;

/// Why `method` cannot name a call on a target, if it cannot.
///
/// A method is one path segment appended to the target's `base_url`, of
/// letters, digits and `-`, `_`, `.`, `~` (not `.` or `..`, nor starting
/// with `.`): nothing that could climb out of the base path (`../admin`,
/// `%2e%2e`), add a query (`?`) or a fragment (`#`), or reach another host.
/// A deeper path belongs in the target's `base_url`, set by the operator.
#[must_use]
pub fn method_problem(method: &str) -> Option<String> {
    if method.is_empty() {
        return Some("is empty".into());
    }
    if method.chars().count() > MAX_METHOD_CHARS {
        return Some(format!("is longer than {MAX_METHOD_CHARS} characters"));
    }
    if let Some(bad) = method
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~')))
    {
        return Some(format!(
            "{method:?} holds {bad:?}: a method is one path segment of letters, digits, '-', '_', '.' and '~' (put a deeper path in the target's base_url)"
        ));
    }
    if method.starts_with('.') {
        return Some(format!("{method:?} starts with '.'"));
    }
    None
}

/// Why `schema` is too large to accept, if it is.
#[must_use]
pub fn schema_size_problem(schema: &Json) -> Option<String> {
    let bytes = serde_json::to_vec(schema).map_or(usize::MAX, |text| text.len());
    (bytes > MAX_SCHEMA_BYTES)
        .then(|| format!("is {bytes} bytes, over the limit of {MAX_SCHEMA_BYTES}"))
}

/// How many regular expressions `schema` holds: each `pattern` string and
/// each key of a `patternProperties` object, at any depth.
#[must_use]
pub fn patterns_in(schema: &Json) -> usize {
    match schema {
        Json::Object(object) => object
            .iter()
            .map(|(keyword, value)| match (keyword.as_str(), value) {
                ("pattern", Json::String(_)) => 1,
                ("patternProperties", Json::Object(patterns)) => patterns
                    .values()
                    .map(patterns_in)
                    .fold(patterns.len(), usize::saturating_add),
                _ => patterns_in(value),
            })
            .fold(0, usize::saturating_add),
        Json::Array(items) => items.iter().map(patterns_in).fold(0, usize::saturating_add),
        _ => 0,
    }
}

/// A definition stored before the bounds on `max_attempts` and
/// `deadline_ms` (this release's) held to them, or `None` when it is
/// within them already. Registering past them is refused; a definition
/// the fleet accepted earlier keeps running, held to them, rather than
/// every job of it failing as a definition that no longer compiles.
#[must_use]
pub fn held_to_bounds(document: &Json) -> Option<Json> {
    use super::{MAX_ATTEMPTS, MAX_DEADLINE_MS};
    let over =
        |field: &str, bound: u64| document[field].as_u64().is_some_and(|value| value > bound);
    let attempts = u64::try_from(MAX_ATTEMPTS).unwrap_or(u64::MAX);
    if !over("max_attempts", attempts) && !over("deadline_ms", MAX_DEADLINE_MS) {
        return None;
    }
    let mut held = document.clone();
    if over("max_attempts", attempts) {
        held["max_attempts"] = Json::from(MAX_ATTEMPTS);
    }
    if over("deadline_ms", MAX_DEADLINE_MS) {
        held["deadline_ms"] = Json::from(MAX_DEADLINE_MS);
    }
    Some(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_is_one_plain_path_segment() {
        for fine in ["charge", "v1.charge", "capture-2", "a_b~c", "x.y"] {
            assert_eq!(method_problem(fine), None, "{fine}");
        }
        for hostile in [
            "../admin",
            "%2e%2e/admin",
            "a/../../admin",
            "x?y",
            "x#y",
            "..",
            ".",
            ".hidden",
            "/admin",
            "a/b",
            "http://elsewhere",
            "@elsewhere",
            "a b",
            "",
        ] {
            assert!(
                method_problem(hostile).is_some(),
                "{hostile:?} was accepted"
            );
        }
        assert!(method_problem(&"m".repeat(MAX_METHOD_CHARS + 1)).is_some());
        assert_eq!(method_problem(&"m".repeat(MAX_METHOD_CHARS)), None);
    }

    #[test]
    fn patterns_are_counted_at_any_depth() {
        let schema = serde_json::json!({
            "pattern": "a",
            "properties": {"x": {"items": [{"pattern": "b"}]}},
            "patternProperties": {"^c": {"pattern": "d"}, "^e": {}}
        });
        assert_eq!(patterns_in(&schema), 5);
    }

    #[test]
    fn schemas_over_the_size_limit_are_named() {
        let big = serde_json::json!({"description": "d".repeat(MAX_SCHEMA_BYTES)});
        assert!(schema_size_problem(&big).is_some());
        assert_eq!(
            schema_size_problem(&serde_json::json!({"type": "object"})),
            None
        );
    }
}
