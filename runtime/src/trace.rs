//! W3C trace context (`traceparent`) as it arrives from outside: checked
//! before it is stored or forwarded, so a malformed one goes no further.

/// Whether `value` is a well-formed W3C `traceparent`:
/// `version-trace_id-parent_id-flags` in lowercase hex, the version not
/// `ff`, neither id all zeros. Version `00` has exactly four fields; a later
/// version may append more after a `-`.
#[must_use]
pub fn valid_traceparent(value: &str) -> bool {
    let bytes = value.as_bytes();
    if bytes.len() < 55 || (bytes.len() > 55 && bytes[55] != b'-') {
        return false;
    }
    let mut fields = value[..55].split('-');
    let (Some(version), Some(trace_id), Some(parent_id), Some(flags), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return false;
    };
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let all_zero = |s: &str| s.bytes().all(|b| b == b'0');
    hex(version, 2)
        && version != "ff"
        && (version != "00" || bytes.len() == 55)
        && hex(trace_id, 32)
        && !all_zero(trace_id)
        && hex(parent_id, 16)
        && !all_zero(parent_id)
        && hex(flags, 2)
}

/// The trace id of a `traceparent` (for log lines: every line of a job's
/// spans names its trace, exported or not); empty when there is none.
#[must_use]
pub fn trace_id(traceparent: Option<&str>) -> &str {
    traceparent
        .filter(|t| valid_traceparent(t))
        .map_or("", |t| &t[3..35])
}

/// Whether `value` may travel as a W3C `tracestate`: at most 512
/// characters of printable ASCII (its list syntax is the vendors' business;
/// a header that could not be sent again is dropped).
#[must_use]
pub fn valid_tracestate(value: &str) -> bool {
    value.len() <= 512 && value.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// A span continues the trace `traceparent` names, with its `tracestate`
/// (when the OpenTelemetry layer is installed; without it this does nothing).
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if !crate::telemetry::exporting() {
        return;
    }
    let Some(traceparent) = traceparent.filter(|t| valid_traceparent(t)) else {
        return;
    };
    let mut carrier =
        std::collections::HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    if let Some(tracestate) = tracestate.filter(|t| valid_tracestate(t)) {
        carrier.insert("tracestate".to_owned(), tracestate.to_owned());
    }
    let parent =
        opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&carrier));
    let _ = span.set_parent(parent);
}

/// The `traceparent` and `tracestate` of `span` itself, for the next hop
/// (an HTTP call, an event's headers); `None` when no trace is being
/// recorded (no OpenTelemetry layer, or the span is not sampled into one).
#[must_use]
pub fn headers_of(span: &tracing::Span) -> Option<(String, Option<String>)> {
    if !crate::telemetry::exporting() {
        return None;
    }
    context_headers(span)
}

/// The `traceparent` and `tracestate` of `span` under whatever OpenTelemetry
/// layer and propagator the program installed (a library's callers set up
/// their own); `None` when the span is in no recorded trace.
#[must_use]
pub fn context_headers(span: &tracing::Span) -> Option<(String, Option<String>)> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = std::collections::HashMap::new();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut carrier);
    });
    let tracestate = carrier.remove("tracestate").filter(|t| !t.is_empty());
    carrier.remove("traceparent").map(|tp| (tp, tracestate))
}

/// For the span where a job enters (the consumer's, the API's): it
/// continues the caller's trace, and the context the run stores is the
/// span's own, or the caller's as it came when no trace is recorded.
#[must_use]
pub fn enter_trace(
    span: &tracing::Span,
    traceparent: Option<String>,
    tracestate: Option<String>,
) -> (Option<String>, Option<String>) {
    continue_trace(span, traceparent.as_deref(), tracestate.as_deref());
    match headers_of(span) {
        Some((traceparent, tracestate)) => (Some(traceparent), tracestate),
        None => (traceparent, tracestate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_traceparents_pass_and_malformed_ones_do_not() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(valid_traceparent(good));
        assert!(valid_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
        ));
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\u{0}",
        ] {
            assert!(!valid_traceparent(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_trace_id_is_read_from_a_valid_traceparent_only() {
        assert_eq!(
            super::trace_id(Some(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            )),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(super::trace_id(Some("00-zz-00f067aa0ba902b7-01")), "");
        assert_eq!(super::trace_id(None), "");
    }
}
