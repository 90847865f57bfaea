//! The published schema of a definition: the file in the repository is the
//! one the model generates, and every definition the repository holds (the
//! demo's, the docs') fits it and compiles.
//!
//! After a change to the model: `FLOTILLA_BLESS=1 cargo test -p
//! flotilla-workflow --test schema` writes the file again.

use std::path::{Path, PathBuf};

use flotilla_workflow::schema::{PUBLISHED_PATH, definition_schema};
use flotilla_workflow::{CompiledWorkflow, read_document};
use serde_json::Value as Json;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workflow crate sits in the repository")
        .to_path_buf()
}

fn generated() -> String {
    serde_json::to_string_pretty(&definition_schema()).expect("a schema serializes") + "\n"
}

#[test]
fn the_published_schema_is_the_one_the_model_generates() {
    let path = repository().join(PUBLISHED_PATH);
    if std::env::var_os("FLOTILLA_BLESS").is_some() {
        std::fs::write(&path, generated()).expect("the schema is written");
    }
    let published = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        published == generated(),
        "{PUBLISHED_PATH} is not what the model generates; after changing the model run \
         FLOTILLA_BLESS=1 cargo test -p flotilla-workflow --test schema"
    );
}

/// Every definition the repository holds: the demo's files and each JSON
/// or YAML block of the docs that is a whole definition (a `name` and
/// `steps`).
fn definitions() -> Vec<(String, Json)> {
    let root = repository();
    let mut found = Vec::new();
    let mut demo: Vec<PathBuf> = std::fs::read_dir(root.join("demo/workflows"))
        .expect("the demo's workflows")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .collect();
    demo.sort();
    for path in demo {
        let text = std::fs::read_to_string(&path).expect("a demo workflow reads");
        let document = read_document(&text).expect("a demo workflow parses");
        found.push((path.display().to_string(), document));
    }
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("the docs")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.push(root.join("README.md"));
    docs.sort();
    for path in docs {
        let text = std::fs::read_to_string(&path).expect("a doc reads");
        for fence in ["```json\n", "```yaml\n"] {
            for (n, block) in text.split(fence).skip(1).enumerate() {
                let block = block.split("\n```").next().unwrap_or_default();
                let Ok(document) = read_document(block) else {
                    continue;
                };
                if document.get("name").is_some() && document.get("steps").is_some() {
                    let at = format!("{} ({} block {})", path.display(), fence.trim(), n + 1);
                    found.push((at, document));
                }
            }
        }
    }
    found
}

#[test]
fn every_definition_in_the_repository_fits_the_schema_and_compiles() {
    let schema = definition_schema();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    let definitions = definitions();
    assert!(
        definitions
            .iter()
            .filter(|(at, _)| at.contains("demo/workflows"))
            .count()
            >= 9
            && definitions
                .iter()
                .any(|(at, _)| at.contains("docs/workflows.md")),
        "the demo's nine workflows and the tutorial's are found: {:?}",
        definitions.iter().map(|(at, _)| at).collect::<Vec<_>>()
    );
    for (at, document) in &definitions {
        let violations: Vec<String> = validator
            .iter_errors(document)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(violations.is_empty(), "{at}: {violations:?}");
        // Any target a step names is accepted: what a target file holds is
        // the fleet's, not the definition's.
        let targets = document["steps"]
            .as_array()
            .into_iter()
            .chain(document["on_failure"].as_array())
            .flatten()
            .filter_map(|step| step["target"].as_str().map(str::to_owned))
            .collect();
        let compiled = std::thread::Builder::new()
            .stack_size(64 * 1024 * 1024)
            .spawn({
                let document = document.clone();
                move || CompiledWorkflow::compile(&document, &targets).map(|_| ())
            })
            .expect("a thread starts")
            .join()
            .expect("compiling does not panic");
        assert!(compiled.is_ok(), "{at}: {compiled:?}");
    }
}

#[test]
fn the_schema_refuses_what_the_model_refuses() {
    let validator = jsonschema::validator_for(&definition_schema()).expect("the schema compiles");
    let sound = serde_json::json!({
        "name": "w", "input_schema": {},
        "steps": [{"name": "a", "target": "t", "method": "m"}]
    });
    assert!(validator.is_valid(&sound));
    for (why, broken) in [
        (
            "a misspelt field",
            serde_json::json!({"name": "w", "input_schema": {}, "steps": [{"name": "a", "need": []}]}),
        ),
        (
            "no steps",
            serde_json::json!({"name": "w", "input_schema": {}, "steps": []}),
        ),
        (
            "attempts out of bounds",
            serde_json::json!({"name": "w", "input_schema": {}, "max_attempts": 0, "steps": [{"name": "a"}]}),
        ),
        (
            "an unknown completion",
            serde_json::json!({"name": "w", "input_schema": {}, "steps": [{"name": "a", "completion": "manual"}]}),
        ),
        (
            "no input_schema",
            serde_json::json!({"name": "w", "steps": [{"name": "a"}]}),
        ),
    ] {
        assert!(!validator.is_valid(&broken), "the schema accepts {why}");
    }
}
