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
//! serving without auth.

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::ApiState;
use super::problem::Problem;

const INDEX_HTML: &str = include_str!("../../ui/index.html");
const APP_JS: &str = include_str!("../../ui/app.js");
const APP_CSS: &str = include_str!("../../ui/app.css");

/// What the console's page may load: its own script, style and API, and
/// nothing inline; it may not be framed.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self' data:; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

/// The console's routes.
pub(super) fn routes() -> Router<ApiState> {
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

/// Refuses a request that changes something when a browser says it comes
/// from another site (`Sec-Fetch-Site: cross-site`, or an `Origin` whose
/// host is not this one). Clients that are not browsers send neither header
/// and pass.
pub(super) async fn refuse_cross_site(request: Request, next: Next) -> Response {
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
}
