//! Errors as `application/problem+json` (RFC 9457), each naming what is wrong.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An error response.
#[derive(Debug)]
pub struct Problem {
    pub status: StatusCode,
    pub detail: String,
    /// Extra members, e.g. `problems`, `violations`, `job`.
    pub extra: Option<Value>,
}

impl Problem {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
            extra: None,
        }
    }

    #[must_use]
    pub fn with(mut self, extra: Value) -> Self {
        self.extra = Some(extra);
        self
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, detail)
    }

    /// The database did not answer: the API still answers, with the reason.
    pub fn unavailable(error: &dyn std::fmt::Display) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database unavailable: {error}"),
        )
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut body = json!({
            "type": "about:blank",
            "title": self.status.canonical_reason().unwrap_or("Error"),
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let (Some(Value::Object(extra)), Some(object)) = (self.extra, body.as_object_mut()) {
            object.extend(extra);
        }
        (
            self.status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body.to_string(),
        )
            .into_response()
    }
}

/// The problem document, for the OpenAPI description.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ProblemDoc {
    #[schema(example = "about:blank")]
    pub r#type: String,
    pub title: String,
    pub status: u16,
    /// What is wrong, and where.
    pub detail: String,
}

/// `axum::Json` whose rejections (bad JSON, wrong shape, too large) are problems.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    axum::Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(Problem::new(
                rejection.status(),
                format!("request body: {}", rejection.body_text()),
            )),
        }
    }
}

/// `axum::extract::Query` whose rejections (a value that does not parse) are problems.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S, T> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(Problem::new(
                rejection.status(),
                format!("query string: {}", rejection.body_text()),
            )),
        }
    }
}
