//! The web console at `/ui`: three static files embedded in the binary (no
//! CDN, nothing fetched at run time). The page is a small script that calls
//! the same `/v1` API with the bearer token the user signs in with, so the
//! console has no routes, rights or secrets of its own.
//!
//! Safe by construction: the page builds every element with text nodes
//! (never parsed HTML), the Content-Security-Policy allows only this
//! origin's script and style (no inline script, no eval), and the token
//! travels in a header only the page's script sets, never in a cookie, so a
//! cross-site request cannot carry it. Changes to `/v1` from another site
//! are refused by [`refuse_cross_site`] as well, which also covers a worker
//! serving without auth, and so is any `/v1` request whose `Host` is not
//! one this worker serves ([`ServedHosts`], against DNS rebinding).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::ApiState;
use crate::problem::Problem;

const INDEX_HTML: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const APP_CSS: &str = include_str!("../ui/app.css");

/// What the console's page may load: its own script, style and API, and
/// nothing inline; it may not be framed.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self' data:; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

/// The console's routes.
pub(crate) fn routes() -> Router<ApiState> {
    Router::new()
        .route(
            "/ui",
            get(|| async { page(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            "/ui/",
            get(|| async { page(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            "/ui/app.js",
            get(|| async { page(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/ui/app.css",
            get(|| async { page(APP_CSS, "text/css; charset=utf-8") }),
        )
}

fn page(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        // Embedded in the binary: a new worker version serves new files.
        (header::CACHE_CONTROL, "no-cache"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The `Host` names `/v1` answers to. A page on another site whose name
/// is made to resolve to this worker (DNS rebinding) is same-origin to the
/// browser, but its requests carry that name in `Host`. IP literals and
/// `localhost` always pass (rebinding needs a name of the attacker's);
/// other names only when listed (`FLOTILLA_HTTP_ALLOWED_HOSTS`). Enforced
/// when names are listed, or when auth is off: without tokens, anything a
/// page reaches is open to it.
#[derive(Debug, Clone, Default)]
pub struct ServedHosts {
    names: Arc<Vec<String>>,
    enforce: bool,
}

impl ServedHosts {
    #[must_use]
    pub fn new(names: &[String], auth_off: bool) -> Self {
        let names: Vec<String> = names
            .iter()
            .map(|name| normalized(name))
            .filter(|name| !name.is_empty())
            .collect();
        Self {
            enforce: auth_off || !names.is_empty(),
            names: Arc::new(names),
        }
    }

    /// Whether `host` (a `Host` header: a name or address, maybe a port)
    /// is one this worker serves.
    fn serves(&self, host: &str) -> bool {
        let host = host.trim();
        let name = if let Some(rest) = host.strip_prefix('[') {
            // `[v6]` or `[v6]:port`: an address literal.
            return rest
                .split_once(']')
                .is_some_and(|(address, _)| address.parse::<std::net::Ipv6Addr>().is_ok());
        } else {
            match host.rsplit_once(':') {
                Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
                _ => host,
            }
        };
        let name = normalized(name);
        name.parse::<std::net::IpAddr>().is_ok()
            || name == "localhost"
            || self.names.contains(&name)
    }
}

/// A host name as compared: lower case, without a trailing dot.
fn normalized(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// Refuses a request that changes something when a browser says it comes
/// from another site (`Sec-Fetch-Site: cross-site`, or an `Origin` whose
/// host is not this one), and any request whose `Host` this worker does
/// not serve. Clients that are not browsers send no `Sec-Fetch-Site` or
/// `Origin` and pass.
pub(crate) async fn refuse_cross_site(
    State(hosts): State<ServedHosts>,
    request: Request,
    next: Next,
) -> Response {
    if hosts.enforce {
        // No `Host` (or one that is not text) is refused too: every
        // browser sends one.
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok());
        if !host.is_some_and(|host| hosts.serves(host)) {
            return Problem::new(
                StatusCode::FORBIDDEN,
                format!(
                    "Host {:?} is not one this worker serves (add it to FLOTILLA_HTTP_ALLOWED_HOSTS)",
                    host.unwrap_or_default()
                ),
            )
            .into_response();
        }
    }
    let reads = [Method::GET, Method::HEAD, Method::OPTIONS];
    if !reads.contains(request.method()) && is_cross_site(request.headers()) {
        return Problem::new(
            StatusCode::FORBIDDEN,
            "cross-site request refused: changes come from this origin's console or from clients that are not browsers",
        )
        .into_response();
    }
    next.run(request).await
}

fn is_cross_site(headers: &HeaderMap) -> bool {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    if text(header::HeaderName::from_static("sec-fetch-site")) == Some("cross-site") {
        return true;
    }
    match (text(header::ORIGIN), text(header::HOST)) {
        // `Origin: null` (a sandboxed frame, a file) is never this origin.
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => {
            let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            !origin_host.eq_ignore_ascii_case(host)
        }
        (Some(_), None) => true,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn same_origin_and_non_browser_requests_pass() {
        assert!(!is_cross_site(&headers(&[])));
        assert!(!is_cross_site(&headers(&[("host", "127.0.0.1:8080")])));
        assert!(!is_cross_site(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
            ("sec-fetch-site", "same-origin"),
        ])));
    }

    #[test]
    fn requests_from_another_site_are_cross_site() {
        assert!(is_cross_site(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(is_cross_site(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "https://evil.example"),
        ])));
        assert!(is_cross_site(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "null"),
        ])));
        assert!(is_cross_site(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:9999"),
        ])));
    }

    #[test]
    fn served_hosts_are_addresses_localhost_and_the_listed_names() {
        let hosts = ServedHosts::new(&["Flotilla.Example.".into()], false);
        for served in [
            "127.0.0.1:8080",
            "10.1.2.3",
            "[::1]:8080",
            "localhost:8080",
            "flotilla.example",
            "FLOTILLA.example:443",
        ] {
            assert!(hosts.serves(served), "{served}");
        }
        for rebound in [
            "evil.example:8080",
            "localhost.evil.example",
            "[evil]:80",
            "127.0.0.1.nip.io",
        ] {
            assert!(!hosts.serves(rebound), "{rebound}");
        }
        assert!(ServedHosts::new(&[], true).enforce);
        assert!(!ServedHosts::new(&[], false).enforce);
    }
}
