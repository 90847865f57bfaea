//! The JSON Schema of a definition document, generated from the model
//! (`model.rs`) so it cannot drift from what the engine reads. Published at
//! [`PUBLISHED_PATH`] for editors and CI, and placed in the API's OpenAPI
//! document; a document the model refuses is explained through it, every
//! structural problem at once.

use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value as Json};

use crate::compiled::DefinitionProblem;
use crate::limits::MAX_VIOLATIONS;
use crate::model::WorkflowDefinition;

/// Where the schema is published in the repository.
pub const PUBLISHED_PATH: &str = "schemas/workflow-definition.schema.json";

/// The schema's `$id`: its path in the repository, which no server needs
/// to answer for an editor that maps it to the local file.
const ID: &str = "https://flotilla.dev/schemas/workflow-definition.schema.json";

/// The schema of a definition document (JSON Schema 2020-12), as
/// published at [`PUBLISHED_PATH`].
#[must_use]
pub fn definition_schema() -> Json {
    let mut schema = SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<WorkflowDefinition>()
        .to_value();
    if let Some(root) = schema.as_object_mut() {
        root.insert("$id".into(), ID.into());
        root.insert("title".into(), "Flotilla workflow definition".into());
    }
    schema
}

/// The schema for an OpenAPI 3 document: the definition's own schema and
/// the schemas it refers to, each by its name under
/// `#/components/schemas/`.
#[must_use]
pub fn openapi_components() -> Vec<(String, Json)> {
    // OpenAPI 3.1 schemas are JSON Schema 2020-12, with the definitions
    // the document's own components.
    let mut root = SchemaSettings::draft2020_12()
        .with(|settings| settings.definitions_path = "/components/schemas".into())
        .into_generator()
        .into_root_schema_for::<WorkflowDefinition>()
        .to_value();
    let Some(object) = root.as_object_mut() else {
        return Vec::new();
    };
    let nested = object
        .remove("components")
        .and_then(|mut c| c.get_mut("schemas").map(Json::take))
        .and_then(|s| match s {
            Json::Object(map) => Some(map),
            _ => None,
        })
        .unwrap_or_default();
    object.remove("$schema");
    let mut all = vec![("WorkflowDefinition".to_owned(), root)];
    all.extend(nested);
    all
}

/// The fields an object of the document may hold: the top level, a step,
/// a step's `start`.
pub(crate) struct KnownFields {
    pub(crate) definition: Vec<String>,
    pub(crate) step: Vec<String>,
    pub(crate) start: Vec<String>,
}

/// The fields of each object, read from the schema once.
pub(crate) fn known_fields() -> &'static KnownFields {
    static FIELDS: OnceLock<KnownFields> = OnceLock::new();
    FIELDS.get_or_init(|| {
        let schema = definition_schema();
        let names = |object: &Json| -> Vec<String> {
            object["properties"]
                .as_object()
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default()
        };
        KnownFields {
            definition: names(&schema),
            step: names(&schema["$defs"]["StepDefinition"]),
            start: names(&schema["$defs"]["StartChild"]),
        }
    })
}

/// Every way `document` breaks the schema, each located by step and field:
/// what the model's own reading (which stops at the first) cannot list.
/// Unknown fields are left to `compile/shape.rs`, which suggests the field
/// meant.
pub(crate) fn structural_problems(document: &Json) -> Vec<DefinitionProblem> {
    static VALIDATOR: OnceLock<Option<jsonschema::Validator>> = OnceLock::new();
    let Some(validator) =
        VALIDATOR.get_or_init(|| jsonschema::validator_for(&definition_schema()).ok())
    else {
        return Vec::new();
    };
    validator
        .iter_errors(document)
        .filter(|e| {
            !matches!(
                e.kind(),
                jsonschema::error::ValidationErrorKind::AdditionalProperties { .. }
            )
        })
        .flat_map(|e| specific(&e))
        .take(MAX_VIOLATIONS)
        .map(|(pointer, message)| {
            let (step, field) = locate(document, &pointer);
            DefinitionProblem {
                step,
                field,
                message,
            }
        })
        .collect()
}

/// An error as the author needs it: for an optional object (`anyOf` a
/// type or null) that fits neither, the errors of the branch its value's
/// type chose (a missing `for`), not "valid under none of the schemas".
fn specific(error: &jsonschema::ValidationError<'_>) -> Vec<(String, String)> {
    use jsonschema::error::ValidationErrorKind;
    let here = error.instance_path().to_string();
    if let ValidationErrorKind::AnyOf { context } = error.kind()
        && let Some(branch) = context.iter().find(|errors| {
            !errors.is_empty()
                && errors.iter().all(|e| {
                    e.instance_path().to_string() != here
                        || !matches!(e.kind(), ValidationErrorKind::Type { .. })
                })
        })
    {
        return branch.iter().flat_map(|e| specific(e)).collect();
    }
    vec![(here, error.to_string())]
}

/// The step and field a JSON pointer into the document falls in: `/steps/2/needs`
/// is the step at position 2 (by its name when it has one), field `needs`.
pub(crate) fn locate(document: &Json, pointer: &str) -> (Option<String>, String) {
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        [list @ ("steps" | "on_failure"), index, rest @ ..] => {
            let name = index
                .parse::<usize>()
                .ok()
                .and_then(|i| document[*list][i]["name"].as_str())
                .map_or_else(|| format!("{list}[{index}]"), str::to_owned);
            let field = if rest.is_empty() {
                "step".to_owned()
            } else {
                rest.join(".")
            };
            (Some(name), field)
        }
        [""] => (None, "document".to_owned()),
        other => (None, other.join(".")),
    }
}

/// The position of each step of `document` by name, for a report that
/// names a step by position too: `steps[2]`, `on_failure[0]`.
#[must_use]
pub fn step_positions(document: &Json) -> Map<String, Json> {
    let mut positions = Map::new();
    for list in ["steps", "on_failure"] {
        for (i, step) in document[list].as_array().into_iter().flatten().enumerate() {
            if let Some(name) = step["name"].as_str() {
                positions
                    .entry(name.to_owned())
                    .or_insert_with(|| Json::String(format!("{list}[{i}]")));
            }
        }
    }
    positions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_knows_every_field_of_the_model() {
        let fields = known_fields();
        for field in [
            "name",
            "input_schema",
            "steps",
            "output",
            "on_failure",
            "max_attempts",
        ] {
            assert!(fields.definition.iter().any(|f| f == field), "{field}");
        }
        for field in [
            "needs",
            "when",
            "for_each",
            "wait_for",
            "start",
            "timeout_ms",
            "paged",
        ] {
            assert!(fields.step.iter().any(|f| f == field), "{field}");
        }
        assert_eq!(fields.start, ["input", "workflow"]);
    }

    #[test]
    fn a_pointer_names_the_step_by_name_or_by_position() {
        let document = serde_json::json!({"steps": [{"name": "a"}, {}]});
        assert_eq!(
            locate(&document, "/steps/0/needs/1"),
            (Some("a".into()), "needs.1".into())
        );
        assert_eq!(
            locate(&document, "/steps/1"),
            (Some("steps[1]".into()), "step".into())
        );
        assert_eq!(
            locate(&document, "/max_attempts"),
            (None, "max_attempts".into())
        );
        assert_eq!(locate(&document, ""), (None, "document".into()));
    }
}
