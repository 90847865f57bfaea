//! The OpenAPI 3 document, generated from the handlers' annotations.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{jobs, ops, problem, workflows};

#[derive(Debug, OpenApi)]
#[openapi(
    info(title = "Flotilla", description = "Durable workflow jobs: submit, inspect, complete external steps, operate."),
    paths(
        jobs::submit, jobs::list, jobs::get, jobs::complete, jobs::retry, jobs::cancel,
        workflows::put, workflows::list, workflows::get,
        ops::healthz, ops::readyz, ops::metrics, ops::openapi
    ),
    components(schemas(jobs::JobView, jobs::SubmitBody, jobs::CompleteBody, jobs::CancelBody, problem::ProblemDoc)),
    modifiers(&BearerAuth)
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
