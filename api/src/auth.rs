//! Bearer tokens and their scopes on `/v1/*`: 401 without a token, 403
//! with a wrong one or one that lacks the route's scope (named in the
//! answer). Tokens are compared in constant time.
//!
//! `FLOTILLA_API_TOKENS` lists the tokens, comma-separated; a token may
//! carry its scopes after its last `:`, joined by `+`
//! (`ci-token:read+submit`). A token without scopes has them all. Each
//! route needs one scope ([`ROUTE_SCOPES`]); a submission with an inline
//! definition needs `define` besides `submit` (checked in the handler).

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::problem::Problem;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Read jobs, their events, workflows and the fleet.
    Read,
    /// Submit jobs of stored workflows.
    Submit,
    /// Answer steps parked for a human or another system.
    Answer,
    /// Retry and cancel jobs.
    Operate,
    /// Register workflows, and submit jobs with inline definitions.
    Define,
}

impl Scope {
    pub const ALL: [Self; 5] = [
        Self::Read,
        Self::Submit,
        Self::Answer,
        Self::Operate,
        Self::Define,
    ];

    /// The name tokens and answers use.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Submit => "submit",
            Self::Answer => "answer",
            Self::Operate => "operate",
            Self::Define => "define",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The scope each `/v1` route needs, by method and route.
pub const ROUTE_SCOPES: &[(&str, &str, Scope)] = &[
    ("POST", "/v1/jobs", Scope::Submit),
    ("GET", "/v1/jobs", Scope::Read),
    ("GET", "/v1/jobs/{job_id}", Scope::Read),
    ("GET", "/v1/jobs/{job_id}/events", Scope::Read),
    ("GET", "/v1/jobs/{job_id}/graph", Scope::Read),
    ("POST", "/v1/jobs/{job_id}/graft", Scope::Define),
    ("POST", "/v1/jobs/{job_id}/signals", Scope::Answer),
    ("GET", "/v1/jobs/{job_id}/signals", Scope::Read),
    (
        "POST",
        "/v1/jobs/{job_id}/steps/{step_name}/complete",
        Scope::Answer,
    ),
    ("POST", "/v1/jobs/bulk/retry", Scope::Operate),
    ("POST", "/v1/jobs/bulk/cancel", Scope::Operate),
    ("POST", "/v1/jobs/{job_id}/retry", Scope::Operate),
    ("POST", "/v1/jobs/{job_id}/cancel", Scope::Operate),
    ("GET", "/v1/workflows", Scope::Read),
    ("GET", "/v1/workflows/{name}", Scope::Read),
    ("PUT", "/v1/workflows/{name}", Scope::Define),
    ("GET", "/v1/workflows/{name}/versions", Scope::Read),
    ("GET", "/v1/schedules", Scope::Read),
    ("GET", "/v1/schedules/{name}", Scope::Read),
    ("PUT", "/v1/schedules/{name}", Scope::Define),
    ("DELETE", "/v1/schedules/{name}", Scope::Define),
    ("POST", "/v1/schedules/{name}/pause", Scope::Operate),
    ("POST", "/v1/schedules/{name}/resume", Scope::Operate),
    ("GET", "/v1/fleet", Scope::Read),
];

/// The route that needs a valid token and no scope: what the token may do.
pub const WHO_AM_I: &str = "/v1/me";

/// A set of scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    /// Every scope: a token without a list, or a worker without auth.
    pub const ALL: Self = Self(0b1_1111);

    #[must_use]
    pub fn has(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// The names, in [`Scope::ALL`] order.
    #[must_use]
    pub fn names(self) -> Vec<&'static str> {
        Scope::ALL
            .into_iter()
            .filter(|scope| self.has(*scope))
            .map(Scope::name)
            .collect()
    }

    /// `read+submit`, or why not.
    fn parse(list: &str) -> Result<Self, String> {
        let mut scopes = 0;
        for name in list.split('+').map(str::trim) {
            let scope = Scope::ALL
                .into_iter()
                .find(|scope| scope.name() == name)
                .ok_or_else(|| {
                    format!(
                        "unknown scope {name:?} (known: {})",
                        Self::ALL.names().join(", ")
                    )
                })?;
            scopes |= scope.bit();
        }
        Ok(Self(scopes))
    }
}

/// What a request's token may do, put in its extensions by
/// [`require_token`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Granted(pub(crate) Scopes);

#[derive(Clone)]
struct Grant {
    token: String,
    scopes: Scopes,
}

/// The accepted tokens; empty means auth is off (`--insecure-no-auth`).
#[derive(Clone, Default)]
pub struct Tokens(Arc<Vec<Grant>>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.0.len())
    }
}

impl Tokens {
    /// Tokens from a comma-separated list, blanks dropped; none is no auth.
    ///
    /// # Errors
    /// An unknown scope, or a token that is empty before its scopes; the
    /// message never holds a token.
    pub fn parse(list: Option<&str>) -> Result<Self, String> {
        let mut grants = Vec::new();
        for (i, entry) in list
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .enumerate()
        {
            let (token, scopes) = match entry.rsplit_once(':') {
                Some((token, scopes)) => (
                    token.trim(),
                    Scopes::parse(scopes).map_err(|e| format!("API token {}: {e}", i + 1))?,
                ),
                None => (entry, Scopes::ALL),
            };
            if token.is_empty() {
                return Err(format!("API token {} is empty before its scopes", i + 1));
            }
            grants.push(Grant {
                token: token.to_owned(),
                scopes,
            });
        }
        Ok(Self(Arc::new(grants)))
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The scopes of `offered`, when it is one of the tokens.
    fn grant(&self, offered: &str) -> Option<Scopes> {
        // Check every token so the time taken does not say which one was close.
        self.0.iter().fold(None, |found, grant| {
            let matches = bool::from(grant.token.as_bytes().ct_eq(offered.as_bytes()));
            if matches { Some(grant.scopes) } else { found }
        })
    }

    /// What the request's bearer token may do: `Ok(None)` without a token,
    /// `Err` with one that is not accepted. With auth off, everything.
    pub(crate) fn granted(&self, headers: &HeaderMap) -> Result<Option<Scopes>, ()> {
        if self.is_empty() {
            return Ok(Some(Scopes::ALL));
        }
        let offered = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        match offered {
            None => Ok(None),
            Some(token) => self.grant(token.trim()).map(Some).ok_or(()),
        }
    }
}

/// The scope `method` on `route` needs; `None` for [`WHO_AM_I`].
fn needed(method: &Method, route: &str) -> Result<Option<Scope>, ()> {
    if route == WHO_AM_I {
        return Ok(None);
    }
    ROUTE_SCOPES
        .iter()
        .find(|(m, r, _)| *m == method.as_str() && *r == route)
        .map(|(_, _, scope)| Some(*scope))
        .ok_or(())
}

pub(crate) async fn require_token(
    State(tokens): State<Tokens>,
    mut request: Request,
    next: Next,
) -> Response {
    let scopes = match tokens.granted(request.headers()) {
        Ok(Some(scopes)) => scopes,
        Ok(None) => {
            return Problem::new(
                StatusCode::UNAUTHORIZED,
                "missing `Authorization: Bearer <token>`",
            )
            .into_response();
        }
        Err(()) => {
            return Problem::new(StatusCode::FORBIDDEN, "the bearer token is not accepted")
                .into_response();
        }
    };
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        .unwrap_or_default();
    match needed(request.method(), &route) {
        Ok(Some(scope)) if !scopes.has(scope) => return lacks(scope).into_response(),
        Ok(_) => {}
        // A route added without a scope is refused to everyone until it
        // gets one (a test checks that every route has one).
        Err(()) => {
            return Problem::new(
                StatusCode::FORBIDDEN,
                format!("{} {route} has no scope: refused", request.method()),
            )
            .into_response();
        }
    }
    request.extensions_mut().insert(Granted(scopes));
    next.run(request).await
}

/// 403 naming the scope the token lacks.
pub(crate) fn lacks(scope: Scope) -> Problem {
    Problem::new(
        StatusCode::FORBIDDEN,
        format!("this token lacks the `{}` scope", scope.name()),
    )
    .with(serde_json::json!({ "missing_scope": scope.name() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_carry_their_scopes_after_the_last_colon() {
        let tokens = Tokens::parse(Some("admin, ci:read+submit, a:b:answer")).unwrap();
        assert_eq!(tokens.grant("admin"), Some(Scopes::ALL));
        assert_eq!(tokens.grant("ci").unwrap().names(), ["read", "submit"]);
        assert_eq!(tokens.grant("a:b").unwrap().names(), ["answer"]);
        assert_eq!(tokens.grant("ci:read+submit"), None);
        assert_eq!(tokens.grant("guess"), None);
    }

    #[test]
    fn a_misspelt_scope_fails_the_list_without_showing_the_token() {
        let error = Tokens::parse(Some("ok, hunter2:raed")).unwrap_err();
        assert!(error.contains("\"raed\""), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
        assert!(Tokens::parse(Some(":read")).is_err());
    }

    #[test]
    fn every_route_needs_a_scope_and_only_who_am_i_needs_none() {
        assert_eq!(needed(&Method::POST, "/v1/jobs"), Ok(Some(Scope::Submit)));
        assert_eq!(
            needed(&Method::PUT, "/v1/workflows/{name}"),
            Ok(Some(Scope::Define))
        );
        assert_eq!(needed(&Method::GET, WHO_AM_I), Ok(None));
        assert_eq!(needed(&Method::DELETE, "/v1/jobs"), Err(()));
    }
}
