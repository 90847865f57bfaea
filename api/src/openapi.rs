//! The OpenAPI 3 document, generated from the handlers' annotations, and
//! the route that serves it.

use std::sync::OnceLock;

use serde_json::json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::{fleet, jobs, ops, problem, schedules, signals, views, workflows};

#[derive(Debug, OpenApi)]
#[openapi(
    info(title = "Flotilla", description = "Durable workflow jobs: submit, inspect, complete external steps, signal, schedule, operate."),
    paths(
        jobs::submit, jobs::list, jobs::get, jobs::events, jobs::graph, jobs::graft, signals::send, signals::list, jobs::complete, jobs::retry, jobs::cancel, jobs::bulk::retry, jobs::bulk::cancel,
        workflows::put, workflows::list, workflows::get, workflows::versions,
        schedules::put, schedules::list, schedules::get, schedules::pause, schedules::resume, schedules::delete, fleet::fleet,
        ops::who_am_i, ops::healthz, ops::readyz, ops::metrics, openapi
    ),
    components(schemas(flotilla_engine::ops::graph_view::GraphView, flotilla_engine::ops::graph_view::NodeView, flotilla_engine::ops::graph_view::NodeState, views::JobView, views::JobPageView, views::TimelineView, fleet::FleetView, fleet::ConsumerLag, jobs::SubmitBody, jobs::CompleteBody, jobs::CancelBody, jobs::GraftBody, jobs::GraftView, jobs::RetryBody, jobs::bulk::BulkBody, jobs::bulk::FilterBody, jobs::bulk::BulkView, signals::SignalBody, signals::SignalView, signals::SignalsView, flotilla_engine::ops::signal::SignalReceipt, schedules::ScheduleBody, schedules::SchedulesView, flotilla_engine::ops::schedules::ScheduleView, flotilla_engine::ops::children::ChildLink, problem::ProblemDoc)),
    modifiers(&BearerAuth, &SharedResponses)
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The answers every `/v1` route shares, stated once: 401 without a token,
/// 403 with a wrong one, 503 when the database does not answer.
struct SharedResponses;

impl Modify for SharedResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let shared = [
            ("401", "no bearer token"),
            (
                "403",
                "the bearer token is not accepted, or lacks the route's scope (named in `missing_scope`)",
            ),
            ("503", "database unavailable"),
        ];
        for (path, item) in &mut openapi.paths.paths {
            if !path.starts_with("/v1/") {
                continue;
            }
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for operation in operations.into_iter().flatten() {
                for (status, description) in shared {
                    let response = ResponseBuilder::new()
                        .description(description)
                        .content(
                            "application/problem+json",
                            ContentBuilder::new()
                                .schema(Some(Ref::from_schema_name("ProblemDoc")))
                                .build(),
                        )
                        .build();
                    operation
                        .responses
                        .responses
                        .insert(status.to_owned(), response.into());
                }
            }
        }
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "ops", responses((status = 200, description = "the OpenAPI 3 document")))]
pub(crate) async fn openapi() -> axum::Json<serde_json::Value> {
    static DOCUMENT: OnceLock<serde_json::Value> = OnceLock::new();
    axum::Json(DOCUMENT.get_or_init(document).clone())
}

/// The document: the handlers' annotations, and the schema of a workflow
/// definition (generated from the model by `flotilla_workflow::schema`,
/// the one published in the repository) under `components/schemas`, which
/// the bodies that carry a definition point at, so an editor or a
/// generated client checks a definition as the worker will.
#[must_use]
pub fn document() -> serde_json::Value {
    let mut document = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    let schemas = &mut document["components"]["schemas"];
    for (name, schema) in flotilla_workflow::schema::openapi_components() {
        schemas[name] = schema;
    }
    let definition = json!({ "$ref": "#/components/schemas/WorkflowDefinition" });
    // PUT /v1/workflows/{name}: the body is a definition.
    if let Some(contents) =
        document["paths"]["/v1/workflows/{name}"]["put"]["requestBody"]["content"].as_object_mut()
    {
        for content in contents.values_mut() {
            content["schema"] = definition.clone();
        }
    }
    // POST /v1/jobs: an inline definition in `workflow`.
    let workflow = &mut document["components"]["schemas"]["SubmitBody"]["properties"]["workflow"];
    if workflow.is_object() {
        *workflow = json!({ "oneOf": [definition, { "type": "null" }] });
    }
    document
}
