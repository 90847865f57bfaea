//! Bearer-token auth for `/v1/*`: 401 without a token, 403 with a wrong one.
//! Tokens are compared in constant time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::problem::Problem;

/// The accepted tokens; empty means auth is off (`--insecure-no-auth`).
#[derive(Debug, Clone, Default)]
pub struct Tokens(pub Arc<Vec<String>>);

impl Tokens {
    fn accepts(&self, offered: &str) -> bool {
        // Check every token so the time taken does not say which one was close.
        self.0.iter().fold(false, |found, token| {
            found | bool::from(token.as_bytes().ct_eq(offered.as_bytes()))
        })
    }
}

pub async fn require_token(State(tokens): State<Tokens>, request: Request, next: Next) -> Response {
    if tokens.0.is_empty() {
        return next.run(request).await;
    }
    let offered = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match offered {
        None => Problem::new(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <token>`",
        )
        .into_response(),
        Some(token) if tokens.accepts(token.trim()) => next.run(request).await,
        Some(_) => {
            Problem::new(StatusCode::FORBIDDEN, "the bearer token is not accepted").into_response()
        }
    }
}
