//! The HTTP target's tests: statuses to failure classes, Retry-After,
//! bodies and connections.
use super::*;

/// `status` with `body`, shown as by default (length and type only).
fn classified(status: StatusCode, body: &[u8]) -> Result<serde_json::Value, StepFailure> {
    let answer = Answer {
        status,
        body,
        content_type: Some("application/json"),
        keep: 0,
        retry_after: None,
        retried: &[],
    };
    classify("http://t/m", &answer)
}

#[test]
fn retry_after_is_read_as_seconds_or_a_date_and_kept_on_429_and_503_only() {
    let now = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    assert_eq!(retry_after(" 30 ", now), Some(Duration::from_secs(30)));
    let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
    assert_eq!(retry_after(&later, now), Some(Duration::from_secs(90)));
    let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
    assert_eq!(retry_after(&earlier, now), None);
    assert_eq!(retry_after("soon", now), None);
    assert_eq!(retry_after("-5", now), None);
    for (code, kept) in [(429, true), (503, true), (502, false), (408, false)] {
        let answer = Answer {
            status: StatusCode::from_u16(code).unwrap(),
            body: b"",
            content_type: None,
            keep: 0,
            retry_after: Some(Duration::from_secs(30)),
            retried: &[],
        };
        let Err(StepFailure::Retryable { after, .. }) = classify("http://t/m", &answer) else {
            panic!("{code} retries");
        };
        assert_eq!(after.is_some(), kept, "{code}");
    }
}

#[test]
fn statuses_map_to_failure_classes() {
    assert!(classified(StatusCode::OK, b"{\"a\":1}").is_ok());
    assert!(matches!(
        classified(StatusCode::OK, b"nope"),
        Err(StepFailure::Defect(_))
    ));
    // 401 and 407: the credentials were refused, which an operator
    // fixes; the jobs back off and retry meanwhile.
    for code in [401, 407, 408, 429, 502, 503, 504] {
        let status = StatusCode::from_u16(code).unwrap();
        assert!(
            matches!(
                classified(status, b""),
                Err(StepFailure::Retryable {
                    class: RetryClass::Status,
                    ..
                })
            ),
            "{code}"
        );
    }
    // 403: credentials accepted, this request refused.
    for code in [400, 403, 404, 409, 500] {
        let status = StatusCode::from_u16(code).unwrap();
        assert!(
            matches!(classified(status, b""), Err(StepFailure::Defect(_))),
            "{code}"
        );
    }
    let verdict = classified(
        StatusCode::UNPROCESSABLE_ENTITY,
        br#"{"violations":["too young"]}"#,
    );
    assert_eq!(
        verdict,
        Err(StepFailure::Verdict {
            message: "POST http://t/m: 422: too young".into(),
            violations: vec!["too young".into()]
        })
    );
    assert!(matches!(
        classified(StatusCode::UNPROCESSABLE_ENTITY, b"{}"),
        Err(StepFailure::Defect(_))
    ));
}

#[tokio::test]
async fn a_refused_connection_is_a_transport_retry_and_a_silent_target_a_timeout() {
    let call = |timeout| TargetCall {
        job_id: uuid::Uuid::new_v4(),
        step_name: "s".into(),
        method: "m".into(),
        request: serde_json::json!({}),
        timeout,
        traceparent: None,
        tracestate: None,
        part: None,
        retry_statuses: Vec::new(),
    };
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let target = HttpTarget::new(&refused, Duration::from_secs(5), 1024).unwrap();
    let failure = target.call(call(Duration::from_secs(5))).await;
    assert!(
        matches!(
            failure,
            Err(StepFailure::Retryable {
                class: RetryClass::Transport,
                ..
            })
        ),
        "{failure:?}"
    );
    // Accepts the connection and never answers: the client's own timer.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let target = HttpTarget::new(&url, Duration::from_millis(100), 1024).unwrap();
    let failure = target.call(call(Duration::ZERO)).await;
    assert!(
        matches!(
            failure,
            Err(StepFailure::Retryable {
                class: RetryClass::Timeout,
                ..
            })
        ),
        "{failure:?}"
    );
    drop(silent);
}

#[test]
fn a_500_is_final_unless_the_target_or_the_step_retries_it() {
    fn answer<'a>(retried: &'a [&'a [u16]]) -> Answer<'a> {
        Answer {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: b"",
            content_type: None,
            keep: 0,
            retry_after: Some(Duration::from_secs(30)),
            retried,
        }
    }
    assert!(matches!(
        classify("http://t/m", &answer(&[])),
        Err(StepFailure::Defect(_))
    ));
    let (target, step): (&[u16], &[u16]) = (&[500], &[502, 500]);
    for retried in [[target, &[]], [&[], step]] {
        let failure = classify("http://t/m", &answer(&retried));
        assert!(
            matches!(
                failure,
                Err(StepFailure::Retryable {
                    class: RetryClass::Status,
                    status: Some(500),
                    after: None,
                    ..
                })
            ),
            "{failure:?}"
        );
    }
    assert!(matches!(
        classify("http://t/m", &answer(&[&[501]])),
        Err(StepFailure::Defect(_))
    ));
}

#[test]
fn a_failed_answer_shows_only_its_length_and_type_unless_kept() {
    let body = b"<html>session=secret-cookie</html>";
    let mut answer = Answer {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        body,
        content_type: Some("text/html"),
        keep: 0,
        retry_after: None,
        retried: &[],
    };
    let Err(StepFailure::Defect(quiet)) = classify("http://t/m", &answer) else {
        panic!("a 500 is a defect");
    };
    assert!(!quiet.contains("secret"), "{quiet}");
    assert!(quiet.contains("a 34-byte body (text/html)"), "{quiet}");
    answer.keep = 6;
    let Err(StepFailure::Defect(kept)) = classify("http://t/m", &answer) else {
        panic!("a 500 is a defect");
    };
    assert!(kept.ends_with("(text/html): <html>"), "{kept}");
}

#[test]
fn the_url_is_built_segment_by_segment_and_shown_without_secrets() {
    let target = HttpTarget::new(
        "https://user:pass@t.example/api/?code=secret",
        Duration::from_secs(1),
        1024,
    )
    .unwrap();
    assert_eq!(target.shown, "https://t.example/api");
    assert_eq!(
        target.url_of("charge").unwrap().as_str(),
        "https://user:pass@t.example/api/charge?code=secret"
    );
    for hostile in ["../admin", "%2e%2e/admin", "a/../../admin", "x?y", "x#y"] {
        assert!(
            matches!(target.url_of(hostile), Err(StepFailure::Defect(_))),
            "{hostile}"
        );
    }
    let bare = HttpTarget::new("http://t.example", Duration::from_secs(1), 1024).unwrap();
    assert_eq!(bare.url_of("m").unwrap().as_str(), "http://t.example/m");
    for refused in ["ftp://t.example", "mailto:a@b", "t.example/api"] {
        assert!(
            HttpTarget::new(refused, Duration::from_secs(1), 1024).is_err(),
            "{refused}"
        );
    }
}
