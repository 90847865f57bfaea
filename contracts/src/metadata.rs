//! Metadata: a caller's labels on a job (`customer: ada`, `batch: 7`), a
//! bounded map of strings carried by a request, kept with the job, echoed
//! on its events and searchable in the API.

use std::collections::BTreeMap;

use crate::RuleViolation;

/// The most entries one job's metadata holds.
pub const MAX_ENTRIES: usize = 16;
/// The longest key, in characters.
pub const MAX_KEY_CHARS: usize = 64;
/// The longest value, in characters.
pub const MAX_VALUE_CHARS: usize = 256;

/// A job's metadata: keys of letters, digits, `_`, `-` and `.`; values any
/// text without NUL. Sorted by key, so equal maps encode alike.
pub type Metadata = BTreeMap<String, String>;

/// Checks `metadata` against the bounds above.
///
/// # Errors
/// [`RuleViolation::Metadata`] naming the entry and the bound.
pub fn check(metadata: &Metadata) -> Result<(), RuleViolation> {
    let broken = |reason: String| Err(RuleViolation::Metadata(reason));
    if metadata.len() > MAX_ENTRIES {
        return broken(format!("{} entries, at most {MAX_ENTRIES}", metadata.len()));
    }
    for (key, value) in metadata {
        let key_chars = key.chars().count();
        if key_chars == 0 || key_chars > MAX_KEY_CHARS {
            return broken(format!("key {key:?}: 1 to {MAX_KEY_CHARS} characters"));
        }
        if !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return broken(format!(
                "key {key:?}: letters, digits, '_', '-' and '.' only"
            ));
        }
        if value.chars().count() > MAX_VALUE_CHARS {
            return broken(format!(
                "value of {key:?}: at most {MAX_VALUE_CHARS} characters"
            ));
        }
        if value.contains('\0') {
            return broken(format!("value of {key:?}: holds a NUL"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(entries: &[(&str, &str)]) -> Metadata {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn labels_within_the_bounds_pass_and_each_bound_is_named_when_broken() {
        assert!(
            check(&of(&[
                ("customer", "ada"),
                ("batch.id", "7"),
                ("a-b_c", "")
            ]))
            .is_ok()
        );
        let long_key = "k".repeat(MAX_KEY_CHARS + 1);
        let long_value = "v".repeat(MAX_VALUE_CHARS + 1);
        let many: Metadata = (0..=MAX_ENTRIES)
            .map(|n| (format!("k{n}"), String::new()))
            .collect();
        let cases = [
            (of(&[("", "x")]), "key \"\""),
            (of(&[("with space", "x")]), "letters, digits"),
            (of(&[(long_key.as_str(), "x")]), "1 to 64"),
            (of(&[("k", long_value.as_str())]), "at most 256"),
            (of(&[("k", "a\0b")]), "NUL"),
            (many, "at most 16"),
        ];
        for (metadata, said) in cases {
            let refused = check(&metadata).unwrap_err().to_string();
            assert!(refused.contains(said), "{refused}");
        }
    }
}
