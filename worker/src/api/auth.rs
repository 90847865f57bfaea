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
#[derive(Clone, Default)]
pub struct Tokens(Arc<Vec<String>>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.0.len())
    }
}

impl Tokens {
    /// Tokens from a comma-separated list, blanks dropped; none is no auth.
    #[must_use]
    pub fn parse(list: Option<&str>) -> Self {
        let tokens = list
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect();
        Self(Arc::new(tokens))
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn accepts(&self, offered: &str) -> bool {
        // Check every token so the time taken does not say which one was close.
        self.0.iter().fold(false, |found, token| {
            found | bool::from(token.as_bytes().ct_eq(offered.as_bytes()))
        })
    }
}

pub(super) async fn require_token(
    State(tokens): State<Tokens>,
    request: Request,
    next: Next,
) -> Response {
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
