//! The HTTP target's tests: statuses to failure classes, Retry-After,
//! bodies and connections.
use super::*;
use flotilla_workflow::http::ResolvedCall;

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
    classify("POST http://t/m", &answer)
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
        let Err(StepFailure::Retryable { after, .. }) = classify("POST http://t/m", &answer) else {
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

/// A call of method `method`, with `shape` when given.
fn call_of(method: &str, shape: Option<ResolvedCall>) -> TargetCall {
    TargetCall {
        job_id: uuid::Uuid::nil(),
        step_name: "s".into(),
        method: method.into(),
        // As the compiler has it: a step naming GET or DELETE has no rules.
        request: if shape
            .as_ref()
            .and_then(|shape| shape.verb)
            .is_some_and(|verb| !verb.has_body())
        {
            serde_json::json!({})
        } else {
            serde_json::json!({"order": 42})
        },
        timeout: Duration::from_secs(5),
        traceparent: None,
        tracestate: None,
        part: None,
        retry_statuses: Vec::new(),
        shape,
    }
}

#[tokio::test]
async fn a_refused_connection_is_a_transport_retry_and_a_silent_target_a_timeout() {
    let call = |timeout| TargetCall {
        timeout,
        ..call_of("m", None)
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
        classify("POST http://t/m", &answer(&[])),
        Err(StepFailure::Defect(_))
    ));
    let (target, step): (&[u16], &[u16]) = (&[500], &[502, 500]);
    for retried in [[target, &[]], [&[], step]] {
        let failure = classify("POST http://t/m", &answer(&retried));
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
        classify("POST http://t/m", &answer(&[&[501]])),
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
    let Err(StepFailure::Defect(quiet)) = classify("POST http://t/m", &answer) else {
        panic!("a 500 is a defect");
    };
    assert!(!quiet.contains("secret"), "{quiet}");
    assert!(quiet.contains("a 34-byte body (text/html)"), "{quiet}");
    answer.keep = 6;
    let Err(StepFailure::Defect(kept)) = classify("POST http://t/m", &answer) else {
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
    let url_of = |target: &HttpTarget, method: &str| target.url_of(&call_of(method, None));
    let (url, shown) = url_of(&target, "charge").unwrap();
    assert_eq!(
        url.as_str(),
        "https://user:pass@t.example/api/charge?code=secret"
    );
    assert_eq!(shown, "https://t.example/api/charge");
    for hostile in ["../admin", "%2e%2e/admin", "a/../../admin", "x?y", "x#y"] {
        assert!(
            matches!(url_of(&target, hostile), Err(StepFailure::Defect(_))),
            "{hostile}"
        );
    }
    let bare = HttpTarget::new("http://t.example", Duration::from_secs(1), 1024).unwrap();
    assert_eq!(url_of(&bare, "m").unwrap().0.as_str(), "http://t.example/m");
    // A step's path goes under the base path, its query after the base's.
    let shape = ResolvedCall {
        verb: Some(Verb::Get),
        path: Some("/orders/a%2F..%2Fb".into()),
        query: vec![("q".into(), "x&y=z".into())],
        headers: Vec::new(),
    };
    let (url, shown) = target.url_of(&call_of("", Some(shape))).unwrap();
    assert_eq!(
        url.as_str(),
        "https://user:pass@t.example/api/orders/a%2F..%2Fb?code=secret&q=x%26y%3Dz"
    );
    assert_eq!(shown, "https://t.example/api/orders/a%2F..%2Fb");
    for refused in ["ftp://t.example", "mailto:a@b", "t.example/api"] {
        assert!(
            HttpTarget::new(refused, Duration::from_secs(1), 1024).is_err(),
            "{refused}"
        );
    }
}

/// A one-shot HTTP server: answers the first request with `response` and
/// hands back the request as it arrived (head and body).
async fn answering(response: &'static str) -> (String, tokio::task::JoinHandle<String>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    let served = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut received = Vec::new();
        let mut buffer = [0u8; 4096];
        // The head, then as much body as it announces.
        loop {
            let n = socket.read(&mut buffer).await.unwrap();
            received.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&received).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(str::to_owned)
                    })
                    .map_or(0, |n| n.trim().parse::<usize>().unwrap());
                if body.len() >= length {
                    break;
                }
            }
            assert!(n > 0, "the client hung up");
        }
        socket.write_all(response.as_bytes()).await.unwrap();
        String::from_utf8(received).unwrap()
    });
    (url, served)
}

#[tokio::test]
async fn a_shaped_call_sends_its_verb_path_query_and_headers_with_the_secret_filled_in() {
    let (url, served) = answering(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\nconnection: close\r\n\r\nready",
    )
    .await;
    let target = HttpTarget::new(&url, Duration::from_secs(5), 1024)
        .unwrap()
        .secrets(BTreeMap::from([(
            "key".to_owned(),
            HeaderValue::from_static("s3cret"),
        )]));
    let shape = ResolvedCall {
        verb: Some(Verb::Get),
        path: Some("/orders/42".into()),
        query: vec![("expand".into(), "lines".into())],
        headers: vec![
            ("X-Tenant".into(), vec![HeaderPiece::Text("acme".into())]),
            (
                "Authorization".into(),
                vec![
                    HeaderPiece::Text("Bearer ".into()),
                    HeaderPiece::Secret("key".into()),
                ],
            ),
        ],
    };
    let answer = target.call(call_of("", Some(shape))).await.unwrap();
    // A text answer is the response as a string.
    assert_eq!(answer, serde_json::json!("ready"));
    let request = served.await.unwrap();
    let (head, body) = request.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("GET /api/orders/42?expand=lines HTTP/1.1"),
        "{head}"
    );
    let head = head.to_ascii_lowercase();
    assert!(head.contains("x-tenant: acme"), "{head}");
    assert!(head.contains("authorization: bearer s3cret"), "{head}");
    assert!(
        head.contains(&format!("idempotency-key: {}:s", uuid::Uuid::nil())),
        "{head}"
    );
    // A GET sends no body.
    assert!(
        body.is_empty() && !head.contains("content-type"),
        "{request}"
    );
    // The secret is never in the target's Debug output.
    assert!(!format!("{target:?}").contains("s3cret"));
}

#[tokio::test]
async fn a_put_sends_the_body_and_an_empty_answer_is_null() {
    let (url, served) = answering("HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n").await;
    let target = HttpTarget::new(&url, Duration::from_secs(5), 1024)
        .unwrap()
        .default_verb(Verb::Put);
    let answer = target.call(call_of("orders", None)).await.unwrap();
    assert_eq!(answer, serde_json::Value::Null);
    let request = served.await.unwrap();
    assert!(request.starts_with("PUT /api/orders HTTP/1.1"), "{request}");
    assert!(request.ends_with("{\"order\":42}"), "{request}");
}

#[tokio::test]
async fn a_secret_the_target_lacks_is_its_configuration_not_the_jobs() {
    let target = HttpTarget::new("http://127.0.0.1:9", Duration::from_secs(5), 1024).unwrap();
    let shape = ResolvedCall {
        verb: Some(Verb::Get),
        path: Some("/x".into()),
        query: Vec::new(),
        headers: vec![(
            "Authorization".into(),
            vec![HeaderPiece::Secret("gone".into())],
        )],
    };
    let failure = target.call(call_of("", Some(shape))).await;
    assert!(
        matches!(&failure, Err(StepFailure::Retryable { class: RetryClass::Other, error, .. }) if error.contains("no secret \"gone\"")),
        "{failure:?}"
    );
}

#[test]
fn a_2xx_body_is_json_null_or_text_unless_it_claims_json() {
    let answer = |body: &'static [u8], content_type| Answer {
        status: StatusCode::OK,
        body,
        content_type,
        keep: 0,
        retry_after: None,
        retried: &[],
    };
    let ok = |body, kind| classify("GET http://t/m", &answer(body, kind));
    assert_eq!(ok(b"", None).unwrap(), serde_json::Value::Null);
    assert_eq!(
        ok(b" \n", Some("application/json")).unwrap(),
        serde_json::Value::Null
    );
    assert_eq!(ok(b"[1]", None).unwrap(), serde_json::json!([1]));
    assert_eq!(
        ok(b"done", Some("text/plain")).unwrap(),
        serde_json::json!("done")
    );
    assert_eq!(ok(b"done", None).unwrap(), serde_json::json!("done"));
    assert!(matches!(
        ok(b"done", Some("application/problem+json")),
        Err(StepFailure::Defect(_))
    ));
    assert!(matches!(
        ok(b"\xff\xfe", Some("text/plain")),
        Err(StepFailure::Defect(_))
    ));
}

#[tokio::test]
async fn a_request_body_the_default_verb_would_drop_is_a_defect_before_any_call() {
    // Nothing listens here: a call that went out would fail otherwise.
    let target = HttpTarget::new("http://127.0.0.1:9", Duration::from_secs(5), 1024)
        .unwrap()
        .default_verb(Verb::Get);
    let failure = target.call(call_of("score", None)).await;
    assert!(
        matches!(&failure, Err(StepFailure::Defect(e)) if e.contains("sends no body")),
        "{failure:?}"
    );
    let empty = TargetCall {
        request: serde_json::json!({}),
        ..call_of("score", None)
    };
    let failure = target.call(empty).await;
    assert!(
        matches!(
            failure,
            Err(StepFailure::Retryable {
                class: RetryClass::Transport,
                ..
            })
        ),
        "no body built: the GET goes out: {failure:?}"
    );
}
