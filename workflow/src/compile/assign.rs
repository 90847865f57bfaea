//! Assignments `field.path = <CEL expression>`: the `rules` and `output`
//! fields.

use super::Problems;
use crate::compiled::Assignment;

impl Problems {
    pub(super) fn assignments(
        &mut self,
        step: Option<&str>,
        field: &str,
        sources: &[String],
    ) -> Vec<Assignment> {
        let mut assignments = Vec::with_capacity(sources.len());
        for (i, source) in sources.iter().enumerate() {
            let field = format!("{field}[{i}]");
            let Some((path, expression)) = split_assignment(source) else {
                self.add(
                    step,
                    &field,
                    format!("{source:?} is not an assignment `field = <CEL expression>`"),
                );
                continue;
            };
            let Some(path) = field_path(path) else {
                self.add(
                    step,
                    &field,
                    format!("left-hand side {path:?} is not a field path like `customer.id`"),
                );
                continue;
            };
            if let Some(expression) = self.expression(step, &field, expression) {
                assignments.push(Assignment { path, expression });
            }
        }
        assignments
    }
}

/// Splits `lhs = rhs` at the first `=` that is not part of `==`, `!=`, `<=` or `>=`.
fn split_assignment(source: &str) -> Option<(&str, &str)> {
    let bytes = source.as_bytes();
    let at = (0..bytes.len()).find(|&i| {
        bytes[i] == b'='
            && bytes.get(i + 1) != Some(&b'=')
            && !matches!(
                i.checked_sub(1).map(|p| bytes[p]),
                Some(b'=' | b'!' | b'<' | b'>')
            )
    })?;
    let (lhs, rhs) = (source[..at].trim(), source[at + 1..].trim());
    (!rhs.is_empty()).then_some((lhs, rhs))
}

/// `a.b_c.d` as its segments, when every segment is an identifier.
fn field_path(path: &str) -> Option<Vec<String>> {
    let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
    let identifier = |s: &String| {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    segments.iter().all(identifier).then_some(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_split_at_the_assigning_equals_sign() {
        assert_eq!(split_assignment("a.b = x == 1"), Some(("a.b", "x == 1")));
        assert_eq!(split_assignment("ok = a != b"), Some(("ok", "a != b")));
        assert_eq!(split_assignment("x == 1"), None);
        assert_eq!(split_assignment("x = "), None);
        assert_eq!(split_assignment("x <= 1"), None);
    }

    #[test]
    fn field_paths_are_dotted_identifiers() {
        assert_eq!(
            field_path("customer.id"),
            Some(vec!["customer".into(), "id".into()])
        );
        assert_eq!(field_path("_x1"), Some(vec!["_x1".into()]));
        assert_eq!(field_path("a..b"), None);
        assert_eq!(field_path("a[0]"), None);
        assert_eq!(field_path("1a"), None);
        assert_eq!(field_path(""), None);
    }
}
