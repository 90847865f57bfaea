//! How long a request may wait for its job to finish: RFC 7240's
//! `Prefer: wait=<seconds>` on a submission, `?wait=<duration>` on a job's
//! view. Either is bounded by the engine's `MAX_WAIT` and by what is left
//! of the request's own time (`--http-request-timeout`), less a margin to
//! answer in, so a long poll always ends in an answer, never in the 503 of
//! a request that took too long.

use std::time::Duration;

use axum::http::HeaderMap;
use axum::http::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use crate::problem::Problem;

/// When the request must have been answered (set by `server::limit_time`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestDeadline(pub(crate) Instant);

/// Kept of the request's time to read the row and answer.
const ANSWER_MARGIN: Duration = Duration::from_millis(500);

/// The seconds of a `wait` preference among the `Prefer` headers. As RFC
/// 7240 asks, a preference that is absent, empty or not a whole number of
/// seconds is ignored (the request is answered as without it).
pub(crate) fn preferred(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get_all(axum::http::header::HeaderName::from_static("prefer"))
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|preference| {
            // `wait=10` possibly followed by `;` parameters, which `wait` has none of.
            let token = preference.split(';').next()?.trim();
            let (name, value) = token.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("wait") {
                return None;
            }
            let seconds: u64 = value.trim().trim_matches('"').parse().ok()?;
            Some(Duration::from_secs(seconds))
        })
}

/// The `wait` query parameter: a duration (`30s`, `500ms`, `1m`) or a
/// whole number of seconds.
///
/// # Errors
/// 400 naming the field for anything else.
pub(crate) fn from_query(raw: Option<&str>) -> Result<Option<Duration>, Problem> {
    let Some(raw) = raw.map(str::trim) else {
        return Ok(None);
    };
    let parsed = raw
        .parse::<u64>()
        .map(Duration::from_secs)
        .or_else(|_| humantime::parse_duration(raw));
    parsed.map(Some).map_err(|_| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            format!("wait is a duration such as 30s or 500ms, or whole seconds; got {raw:?}"),
        )
        .with(json!({ "field": "wait" }))
    })
}

/// `asked`, bounded by the engine's longest wait and by the request's deadline.
pub(crate) fn bounded(asked: Duration, deadline: Option<RequestDeadline>) -> Duration {
    let left = deadline.map_or(Duration::MAX, |RequestDeadline(at)| {
        at.saturating_duration_since(Instant::now())
            .saturating_sub(ANSWER_MARGIN)
    });
    asked
        .min(flotilla_engine::ops::awaiting::MAX_WAIT)
        .min(left)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn prefer(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("prefer", HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_wait_preference_is_found_among_others_and_a_malformed_one_is_ignored() {
        let cases: [(&[&str], Option<u64>); 7] = [
            (&["wait=10"], Some(10)),
            (&["respond-async, WAIT = 5"], Some(5)),
            (&["return=minimal", "wait=\"7\""], Some(7)),
            (&["wait=abc"], None),
            (&["wait=-1"], None),
            (&["wait="], None),
            (&["handling=lenient"], None),
        ];
        for (values, expected) in cases {
            assert_eq!(
                preferred(&prefer(values)),
                expected.map(Duration::from_secs),
                "{values:?}"
            );
        }
    }

    #[test]
    fn a_query_wait_is_a_duration_or_seconds_and_anything_else_is_refused() {
        assert_eq!(from_query(None).unwrap(), None);
        assert_eq!(
            from_query(Some("30")).unwrap(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            from_query(Some("250ms")).unwrap(),
            Some(Duration::from_millis(250))
        );
        for bad in ["", "soon", "-3s", "1.5"] {
            assert!(from_query(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_wait_is_bounded_by_the_longest_and_by_the_request_deadline() {
        let long = Duration::from_secs(3600);
        assert_eq!(
            bounded(long, None),
            flotilla_engine::ops::awaiting::MAX_WAIT
        );
        let soon = RequestDeadline(Instant::now() + Duration::from_secs(5));
        let got = bounded(long, Some(soon));
        assert!(
            got <= Duration::from_millis(4_500) && got > Duration::from_secs(4),
            "{got:?}"
        );
        assert_eq!(
            bounded(Duration::from_secs(1), Some(soon)),
            Duration::from_secs(1)
        );
    }
}
