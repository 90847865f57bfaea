//! Call shapes: templates parsed and filled, paths kept under the base
//! URL, header values kept on one line, secrets kept to headers.
use super::*;
use serde_json::json;

fn step(shape: Json) -> StepDefinition {
    let mut document = json!({"name": "s", "target": "t"});
    document
        .as_object_mut()
        .unwrap()
        .extend(shape.as_object().unwrap().clone());
    serde_json::from_value(document).unwrap()
}

fn compiled(shape: Json) -> CallShape {
    CallShape::compile(&step(shape))
        .unwrap_or_else(|problems| panic!("{problems:?}"))
        .expect("a shape")
}

fn refused(shape: Json) -> Vec<(String, String)> {
    CallShape::compile(&step(shape)).expect_err("refused")
}

fn scope(input: Json) -> Scope {
    Scope::default().with("input", &input)
}

#[test]
fn a_path_query_and_headers_are_filled_and_encoded() {
    let shape = compiled(json!({
        "verb": "GET",
        "path": "/orders/{input.id}/lines/{input.n}.json",
        "query": {"expand": "{input.expand}", "q": "name:{input.name}", "gone": "{input.none}"},
        "headers": {"X-Tenant": "t-{input.tenant}", "Authorization": "Bearer {secrets.orders_key}"}
    }));
    let input = json!({"id": "a/b?c#d", "n": 7, "expand": true, "name": "Ada L", "none": null, "tenant": "acme"});
    let call = shape.resolve(&scope(input)).unwrap();
    assert_eq!(
        call.path.as_deref(),
        Some("/orders/a%2Fb%3Fc%23d/lines/7.json")
    );
    assert_eq!(
        call.query,
        [
            ("expand".to_owned(), "true".to_owned()),
            ("q".to_owned(), "name:Ada L".to_owned())
        ]
    );
    assert_eq!(
        call.shown(Verb::Post),
        "GET /orders/a%2Fb%3Fc%23d/lines/7.json?expand=true&q=name%3AAda%20L"
    );
    assert_eq!(
        call.headers,
        [
            (
                "Authorization".to_owned(),
                vec![
                    HeaderPiece::Text("Bearer ".into()),
                    HeaderPiece::Secret("orders_key".into())
                ]
            ),
            (
                "X-Tenant".to_owned(),
                vec![HeaderPiece::Text("t-acme".into())]
            ),
        ]
    );
}

#[test]
fn braces_nest_in_placeholders_and_double_braces_are_text() {
    // A map literal and a quoted brace inside one placeholder.
    let shape = compiled(json!({"path": "/x/{ {'a': 'b}'}['a'] }"}));
    assert_eq!(
        shape.resolve(&scope(json!({}))).unwrap().path.as_deref(),
        Some("/x/b%7D")
    );
    let shape = compiled(json!({"headers": {"X-J": "{{\"id\": {input.id}}}"}}));
    let call = shape.resolve(&scope(json!({"id": 4}))).unwrap();
    assert_eq!(call.headers[0].1, [HeaderPiece::Text("{\"id\": 4}".into())]);
    // A brace is no path text, doubled or not.
    let problems = refused(json!({"path": "/x/{{literal}}"}));
    assert!(problems[0].1.contains("'{'"), "{problems:?}");
}

#[test]
fn a_path_that_could_leave_the_base_url_is_refused_when_it_compiles() {
    for (path, says) in [
        ("orders", "starts with '/'"),
        ("//evil.example/x", "empty segment"),
        ("/a/../admin", "\"..\""),
        ("/a/./b", "\".\""),
        ("/a/", "empty segment"),
        ("/a?admin=1", "'?'"),
        ("/a#frag", "'#'"),
        ("/a/%2e%2e", "'%'"),
        ("/a\\b", "'\\\\'"),
        ("/{secrets.key}", "header values only"),
        ("/{input.id", "never closed"),
        ("/a}", "closes nothing"),
        ("/{}", "empty placeholder"),
    ] {
        let problems = refused(json!({ "path": path }));
        assert!(
            problems
                .iter()
                .any(|(field, message)| field == "path" && message.contains(says)),
            "{path}: {problems:?}"
        );
    }
}

#[test]
fn a_value_that_would_make_a_dot_or_empty_segment_fails_the_call() {
    let shape = compiled(json!({"path": "/files/{input.name}"}));
    for name in ["..", ".", ""] {
        let error = shape.resolve(&scope(json!({ "name": name }))).unwrap_err();
        assert!(error.contains("empty, '.' or '..'"), "{name:?}: {error}");
    }
    // A dot inside a longer value is plain text; a slash is encoded.
    let call = shape
        .resolve(&scope(json!({"name": "../../etc/passwd"})))
        .unwrap();
    assert_eq!(call.path.as_deref(), Some("/files/..%2F..%2Fetc%2Fpasswd"));
}

#[test]
fn header_values_stay_on_one_line() {
    let problems = refused(json!({"headers": {"X-A": "a\r\nX-Injected: 1"}}));
    assert!(problems[0].1.contains("CR, LF or NUL"), "{problems:?}");
    let shape = compiled(json!({"headers": {"X-A": "{input.v}"}}));
    for value in ["a\r\nX-Injected: 1", "a\nb", "a\0b"] {
        let error = shape.resolve(&scope(json!({ "v": value }))).unwrap_err();
        assert!(error.contains("CR, LF or NUL"), "{error}");
    }
    for name in [
        "Host",
        "content-length",
        "Idempotency-Key",
        "traceparent",
        "X A",
    ] {
        let problems = refused(json!({"headers": { name: "v" }}));
        assert_eq!(problems[0].0, format!("headers.{name}"), "{problems:?}");
    }
    let problems = refused(json!({"headers": {"X-A": "{secrets.}"}}));
    assert!(problems[0].1.contains("a secret's name"), "{problems:?}");
}

#[test]
fn placeholders_give_text_or_the_call_fails_naming_its_field() {
    let shape = compiled(json!({"path": "/o/{input.v}", "query": {"q": "{input.v}"}}));
    for (value, kind) in [
        (json!(null), "null"),
        (json!([1]), "a list"),
        (json!({"a": 1}), "a map"),
    ] {
        let error = shape.resolve(&scope(json!({ "v": value }))).unwrap_err();
        assert!(
            error.starts_with("path:") && error.contains(kind),
            "{error}"
        );
    }
    let error = shape.resolve(&scope(json!({}))).unwrap_err();
    assert!(error.starts_with("path:"), "{error}");
}

#[test]
fn the_fields_that_cannot_go_together_are_refused() {
    let problems = refused(json!({"method": "m", "path": "/p"}));
    assert!(problems[0].1.contains("not both"), "{problems:?}");
    let problems = refused(json!({"verb": "GET", "path": "/p", "rules": ["a = 1"]}));
    assert_eq!(problems[0].0, "rules");
    assert!(problems[0].1.contains("GET sends no body"), "{problems:?}");
    let many: serde_json::Map<String, Json> = (0..=MAX_PARAMETERS)
        .map(|n| (format!("q{n}"), json!("v")))
        .collect();
    let problems = refused(json!({ "query": many }));
    assert!(problems[0].1.contains("over the limit"), "{problems:?}");
    assert!(
        CallShape::compile(&step(json!({"method": "m"})))
            .unwrap()
            .is_none()
    );
}
