//! What identifies a submission's content, so a repeated `job_id` can be
//! told apart as an idempotent repeat or a conflict; and what identifies a
//! `for_each` step's list, so a segment can tell that it lists the items of
//! the segments before it, in their order.

use serde_json::Value as Json;
use sha2::{Digest, Sha256};

/// What identifies a `for_each` step's list: its items in order, hashed
/// over canonical JSON.
pub(crate) fn list_digest(list: &[Json]) -> String {
    let mut canonical = String::from("[");
    for (i, item) in list.iter().enumerate() {
        if i > 0 {
            canonical.push(',');
        }
        write_canonical(item, &mut canonical);
    }
    canonical.push(']');
    hex_sha256(&canonical)
}

pub(crate) fn hex_sha256(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// JSON with object keys sorted at every level, whatever map order serde_json uses.
pub(crate) fn write_canonical(value: &Json, out: &mut String) {
    match value {
        Json::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Json::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&fields[key], out);
            }
            out.push('}');
        }
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_digest_tells_the_order_of_the_items_and_not_the_order_of_keys() {
        let a = list_digest(&[serde_json::json!({"x": 1, "y": 2}), serde_json::json!("b")]);
        let b = list_digest(&[serde_json::json!({"y": 2, "x": 1}), serde_json::json!("b")]);
        let swapped = list_digest(&[serde_json::json!("b"), serde_json::json!({"x": 1, "y": 2})]);
        assert_eq!(a, b);
        assert_ne!(a, swapped);
    }
}
