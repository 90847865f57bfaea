//! Fields a definition does not have: each named where it stands, with the
//! field most likely meant (`need` → `needs`), and set aside so the rest
//! of the document is still read and checked.

use serde_json::{Map, Value as Json};

use super::Problems;
use crate::schema::known_fields;

/// `document` without the fields the model does not have, each of which is
/// a problem.
pub(super) fn without_unknown_fields(document: &Json, problems: &mut Problems) -> Json {
    let mut document = document.clone();
    let fields = known_fields();
    if let Some(top) = document.as_object_mut() {
        set_aside(top, &fields.definition, (None, ""), problems);
    }
    for list in ["steps", "on_failure"] {
        let Some(steps) = document.get_mut(list).and_then(Json::as_array_mut) else {
            continue;
        };
        for (i, step) in steps.iter_mut().enumerate() {
            let Some(object) = step.as_object_mut() else {
                continue;
            };
            let at = object
                .get("name")
                .and_then(Json::as_str)
                .map_or_else(|| format!("{list}[{i}]"), str::to_owned);
            set_aside(object, &fields.step, (Some(&at), ""), problems);
            if let Some(start) = object.get_mut("start").and_then(Json::as_object_mut) {
                set_aside(start, &fields.start, (Some(&at), "start."), problems);
            }
        }
    }
    document
}

/// Removes from `object` each field not in `known`, adding its problem at
/// `step`, its field name after `prefix`.
fn set_aside(
    object: &mut Map<String, Json>,
    known: &[String],
    (step, prefix): (Option<&str>, &str),
    problems: &mut Problems,
) {
    let unknown: Vec<String> = object
        .keys()
        .filter(|key| !known.contains(key))
        .cloned()
        .collect();
    for key in unknown {
        object.remove(&key);
        let message = match meant(&key, known) {
            Some(meant) => format!("no such field; did you mean `{prefix}{meant}`?"),
            None => format!("no such field (the fields here: {})", known.join(", ")),
        };
        problems.add(step, &format!("{prefix}{key}"), message);
    }
}

/// The known field closest to `key`, when it is close: a letter or two
/// away, a third of a long name, or the start of a field (`timeout` for
/// `timeout_ms`).
fn meant<'k>(key: &str, known: &'k [String]) -> Option<&'k str> {
    let most = (key.chars().count() / 3).max(2);
    known
        .iter()
        .map(|field| (strsim::damerau_levenshtein(key, field), field))
        .filter(|(distance, field)| {
            *distance <= most || (key.chars().count() >= 4 && field.starts_with(key))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, field)| field.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(fields: &[&str]) -> Vec<String> {
        fields.iter().map(|&f| f.to_owned()).collect()
    }

    #[test]
    fn a_misspelt_field_suggests_the_one_meant() {
        let fields = known(&["needs", "name", "when", "for_each", "timeout_ms"]);
        assert_eq!(meant("need", &fields), Some("needs"));
        assert_eq!(meant("foreach", &fields), Some("for_each"));
        assert_eq!(meant("timeout", &fields), Some("timeout_ms"));
        assert_eq!(meant("priority", &fields), None);
    }
}
