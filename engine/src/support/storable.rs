//! What the store cannot hold, found before anything is written: Postgres
//! refuses a NUL character in text and in JSON strings, and a workflow name
//! long enough to overflow an index entry. A submission that carries one is
//! the submitter's fault (a 400, a dead letter), never an outage.

use serde_json::Value as Json;

/// The longest workflow name accepted, in characters.
pub const MAX_WORKFLOW_NAME_CHARS: usize = 200;

/// A value the store cannot hold, and where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {reason}")]
pub struct Unstorable {
    /// Where: `job_id`, `workflow_name`, `input.a.b[2]`…
    pub field: String,
    pub reason: String,
}

impl Unstorable {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// A workflow name the store can hold: no NUL, at most
/// [`MAX_WORKFLOW_NAME_CHARS`] characters.
///
/// # Errors
/// The name breaks one of these.
pub(crate) fn check_workflow_name(name: &str) -> Result<(), Unstorable> {
    if name.contains('\0') {
        return Err(Unstorable::new("workflow_name", "contains a NUL character"));
    }
    let chars = name.chars().count();
    if chars > MAX_WORKFLOW_NAME_CHARS {
        return Err(Unstorable::new(
            "workflow_name",
            format!("is {chars} characters long, over the limit of {MAX_WORKFLOW_NAME_CHARS}"),
        ));
    }
    Ok(())
}

/// A text the store can hold: no NUL.
///
/// # Errors
/// The text holds a NUL.
pub(crate) fn check_text(field: &str, text: &str) -> Result<(), Unstorable> {
    if text.contains('\0') {
        return Err(Unstorable::new(field, "contains a NUL character"));
    }
    Ok(())
}

/// A JSON document the store can hold: no NUL in any string or key.
///
/// # Errors
/// The path of the first string or key with a NUL.
pub(crate) fn check_json(root: &str, value: &Json) -> Result<(), Unstorable> {
    match first_nul(value, root) {
        Some(path) => Err(Unstorable::new(path, "contains a NUL character")),
        None => Ok(()),
    }
}

fn first_nul(value: &Json, path: &str) -> Option<String> {
    match value {
        Json::String(text) => text.contains('\0').then(|| path.to_owned()),
        Json::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| first_nul(item, &format!("{path}[{i}]"))),
        Json::Object(fields) => fields.iter().find_map(|(key, item)| {
            let at = format!("{path}.{}", key.replace('\0', "\\u0000"));
            if key.contains('\0') {
                Some(at)
            } else {
                first_nul(item, &at)
            }
        }),
        Json::Null | Json::Bool(_) | Json::Number(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_nul_anywhere_is_found_with_its_path() {
        assert_eq!(
            check_json("input", &json!({"a": [1, "ok", {"b": "x\u{0}y"}]}))
                .unwrap_err()
                .field,
            "input.a[2].b"
        );
        assert_eq!(
            check_json("input", &json!({"k\u{0}": 1}))
                .unwrap_err()
                .field,
            "input.k\\u0000"
        );
        assert!(check_json("input", &json!({"a": ["fine", null, 2.5]})).is_ok());
    }

    #[test]
    fn workflow_names_are_capped_and_nul_free() {
        assert!(check_workflow_name(&"w".repeat(MAX_WORKFLOW_NAME_CHARS)).is_ok());
        assert!(check_workflow_name(&"w".repeat(MAX_WORKFLOW_NAME_CHARS + 1)).is_err());
        assert!(check_workflow_name("a\0b").is_err());
    }
}
