//! Reaching services over TLS, against real TLS endpoints made here with the
//! test's own certificate authority:
//!
//! - Postgres (a cluster of the test's own that refuses plaintext), through
//!   the worker binary: `verify-full` from the standard `PG*` variables and
//!   from `DATABASE_URL`, refused with the wrong CA, a client certificate.
//! - An HTTPS target configured from a targets file: its CA file, a header
//!   read from a secret file, a client certificate; without the CA a call
//!   fails as a defect (retrying would not change the certificate).
//! - The Schema Registry behind HTTPS with basic auth.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use flotilla_tests::tls::{TestCertificates, serve_https};
use flotilla_tests::tls_postgres::{CERTIFICATE_USER, TlsPostgres};
use flotilla_worker::targets::http::{HttpTarget, HttpTls};
use flotilla_worker::targets::{StepFailure, TargetCall, Targets};
use serde_json::json;
use uuid::Uuid;

fn migrate(url: &str, env: &[(&str, &std::path::Path)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-worker"));
    command
        .arg("migrate")
        .env("DATABASE_URL", url)
        .env("NO_COLOR", "1")
        .env_remove("PGSSLMODE")
        .env_remove("PGSSLROOTCERT")
        .env_remove("PGSSLCERT")
        .env_remove("PGSSLKEY");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

#[test]
fn postgres_is_reached_with_verify_full_and_refused_with_the_wrong_ca() {
    let cluster = TlsPostgres::start();
    let certs = &cluster.certificates;
    let url = cluster.url("postgres");

    // The standard variables, as a managed database's documentation says.
    let verified = migrate(
        &url,
        &[
            ("PGSSLMODE", "verify-full".as_ref()),
            ("PGSSLROOTCERT", &certs.ca),
        ],
    );
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );

    let refused = migrate(
        &url,
        &[
            ("PGSSLMODE", "verify-full".as_ref()),
            ("PGSSLROOTCERT", &certs.other_ca),
        ],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "the wrong CA was accepted");
    assert!(stderr.contains("connecting to Postgres"), "{stderr}");

    // The same in the URL; and a plaintext-only client is refused (the
    // cluster accepts TLS only), so the success above went over TLS.
    let in_url = format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        certs.ca.display()
    );
    assert!(migrate(&in_url, &[]).status.success());
    let plaintext = migrate(&format!("{url}?sslmode=disable"), &[]);
    assert!(!plaintext.status.success());
}

#[test]
fn postgres_takes_a_client_certificate() {
    let cluster = TlsPostgres::start();
    let certs = &cluster.certificates;
    let url = cluster.url(CERTIFICATE_USER);
    let with_certificate = format!(
        "{url}?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        certs.ca.display(),
        certs.client_certificate.display(),
        certs.client_key.display()
    );
    let accepted = migrate(&with_certificate, &[]);
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    let without = format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        certs.ca.display()
    );
    assert!(!migrate(&without, &[]).status.success());
}

/// A TLS file that cannot be read stops the process before any connection,
/// naming the setting and the path (sqlx alone says only "No such file or
/// directory").
#[test]
fn a_missing_postgres_tls_file_is_named_with_its_setting() {
    let cluster = TlsPostgres::start();
    let certs = &cluster.certificates;
    let url = cluster.url(CERTIFICATE_USER);
    let missing = certs.dir.join("not-there.pem");
    let missing_text = missing.display().to_string();
    let file = |path: &std::path::Path| path.display().to_string();
    let refused_with = |output: &std::process::Output, setting: &str| {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{setting}: {stderr}");
        assert!(stderr.contains(setting), "{setting}: {stderr}");
        assert!(stderr.contains(&missing_text), "{setting}: {stderr}");
    };

    for (setting, root, certificate, key) in [
        (
            "sslrootcert",
            &missing_text,
            file(&certs.client_certificate),
            file(&certs.client_key),
        ),
        (
            "sslcert",
            &file(&certs.ca),
            missing_text.clone(),
            file(&certs.client_key),
        ),
        (
            "sslkey",
            &file(&certs.ca),
            file(&certs.client_certificate),
            missing_text.clone(),
        ),
    ] {
        let in_url = format!(
            "{url}?sslmode=verify-full&sslrootcert={root}&sslcert={certificate}&sslkey={key}"
        );
        refused_with(&migrate(&in_url, &[]), setting);
    }

    // From the standard variables.
    for variable in ["PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"] {
        let mut env: Vec<(&str, &std::path::Path)> = vec![
            ("PGSSLMODE", "verify-full".as_ref()),
            ("PGSSLROOTCERT", &certs.ca),
            ("PGSSLCERT", &certs.client_certificate),
            ("PGSSLKEY", &certs.client_key),
        ];
        env.retain(|(name, _)| *name != variable);
        env.push((variable, &missing));
        refused_with(&migrate(&url, &env), variable);
    }

    // The URL wins over a variable: a good file there is used as given.
    let good = format!(
        "{url}?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        certs.ca.display(),
        certs.client_certificate.display(),
        certs.client_key.display()
    );
    let accepted = migrate(&good, &[("PGSSLROOTCERT", &missing)]);
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
}

fn call(method: &str) -> TargetCall {
    TargetCall {
        job_id: Uuid::new_v4(),
        step_name: "s".into(),
        method: method.into(),
        request: json!({"x": 1}),
        timeout: Duration::from_secs(5),
        traceparent: None,
        tracestate: None,
        part: None,
        retry_statuses: Vec::new(),
        shape: None,
    }
}

/// Answers 200 only to a caller that sent the expected credentials.
async fn guarded(headers: HeaderMap) -> (StatusCode, axum::Json<serde_json::Value>) {
    let authorised = headers
        .get("authorization")
        .is_some_and(|v| v == "Bearer from-a-mounted-secret")
        && headers.get("x-api-key").is_some_and(|v| v == "plain-key");
    if authorised {
        (StatusCode::OK, axum::Json(json!({"ok": true})))
    } else {
        (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": "who are you"})),
        )
    }
}

#[tokio::test]
async fn an_https_target_is_called_with_its_ca_and_headers_from_a_secret_file() {
    let dir = std::env::temp_dir().join(format!("flotilla-tls-target-{}", Uuid::new_v4()));
    let certs = TestCertificates::generate(&dir, "worker");
    let router = axum::Router::new().route("/check", post(guarded));
    let url = serve_https(router, certs.server_config(false)).await;
    let secret = dir.join("token");
    std::fs::write(&secret, "Bearer from-a-mounted-secret\n").unwrap();
    let file = dir.join("targets.yaml");
    let targets_yaml = |ca: &std::path::Path| {
        format!(
            "targets:\n  secure:\n    kind: http\n    base_url: {url}\n    ca_file: {}\n    headers:\n      Authorization: {{from_file: {}}}\n      X-Api-Key: plain-key\n",
            ca.display(),
            secret.display()
        )
    };

    std::fs::write(&file, targets_yaml(&certs.ca)).unwrap();
    let mut targets = Targets::default();
    flotilla_worker::targets::file::load(&file, &mut targets).unwrap();
    let answer = targets.call("secure", call("check")).await.unwrap();
    assert_eq!(answer, json!({"ok": true}));
    assert!(
        !format!("{targets:?}").contains("from-a-mounted-secret"),
        "a header value reached Debug output"
    );

    // Another CA: the certificate is refused, a defect named as such.
    std::fs::write(&file, targets_yaml(&certs.other_ca)).unwrap();
    let mut untrusting = Targets::default();
    flotilla_worker::targets::file::load(&file, &mut untrusting).unwrap();
    match untrusting.call("secure", call("check")).await {
        Err(StepFailure::Defect(message)) => {
            assert!(message.contains("certificate"), "{message}");
            assert!(!message.contains("from-a-mounted-secret"), "{message}");
        }
        other => panic!("a refused certificate must be a defect, got {other:?}"),
    }

    // A test bench may turn verification off (logged loudly at load).
    std::fs::write(
        &file,
        targets_yaml(&certs.other_ca).replace(
            "    ca_file:",
            "    insecure_skip_verify: true\n    # ca_file:",
        ),
    )
    .unwrap();
    let mut trusting = Targets::default();
    flotilla_worker::targets::file::load(&file, &mut trusting).unwrap();
    assert_eq!(
        trusting.call("secure", call("check")).await.unwrap(),
        json!({"ok": true})
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn an_https_target_that_requires_a_client_certificate_gets_one() {
    let dir = std::env::temp_dir().join(format!("flotilla-tls-mtls-{}", Uuid::new_v4()));
    let certs = TestCertificates::generate(&dir, "worker");
    let router =
        axum::Router::new().route("/m", post(|| async { axum::Json(json!({"mtls": true})) }));
    let url = serve_https(router, certs.server_config(true)).await;

    let tls = HttpTls {
        ca_file: Some(certs.ca.clone()),
        client_identity: Some((certs.client_certificate.clone(), certs.client_key.clone())),
        insecure_skip_verify: false,
    };
    let target =
        HttpTarget::configured(&url, Duration::from_secs(5), 1024, &tls, HeaderMap::new()).unwrap();
    let mut targets = Targets::default();
    targets.register("mtls", Arc::new(target), 1);
    assert_eq!(
        targets.call("mtls", call("m")).await.unwrap(),
        json!({"mtls": true})
    );

    let anonymous = HttpTls {
        client_identity: None,
        ..tls
    };
    let target = HttpTarget::configured(
        &url,
        Duration::from_secs(5),
        1024,
        &anonymous,
        HeaderMap::new(),
    )
    .unwrap();
    let mut targets = Targets::default();
    targets.register("mtls", Arc::new(target), 1);
    assert!(targets.call("mtls", call("m")).await.is_err());
    std::fs::remove_dir_all(dir).unwrap();
}

/// An HTTPS front for the real registry that lets through only requests
/// with the expected basic-auth credentials (as a managed registry does).
async fn guarded_registry(certs: &TestCertificates) -> String {
    use axum::extract::{Request, State};
    use axum::response::IntoResponse;

    async fn forward(State(upstream): State<String>, request: Request) -> axum::response::Response {
        use base64::Engine as _;
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("flotilla:s3cret:with-colon")
        );
        if request
            .headers()
            .get("authorization")
            .is_none_or(|v| v != expected.as_str())
        {
            return (
                StatusCode::UNAUTHORIZED,
                "{\"error_code\":401,\"message\":\"Unauthorized\"}",
            )
                .into_response();
        }
        let (parts, body) = request.into_parts();
        let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let client = flotilla_runtime::tls::http_client().build().unwrap();
        let mut outbound = client
            .request(parts.method, format!("{upstream}{path}"))
            .body(body);
        if let Some(kind) = parts.headers.get("content-type") {
            outbound = outbound.header("content-type", kind);
        }
        let answer = outbound.send().await.unwrap();
        let status = StatusCode::from_u16(answer.status().as_u16()).unwrap();
        (status, answer.bytes().await.unwrap()).into_response()
    }

    let router = axum::Router::new()
        .fallback(forward)
        .with_state(flotilla_tests::schema_registry_url());
    serve_https(router, certs.server_config(false)).await
}

#[tokio::test]
async fn the_registry_is_reached_over_https_with_basic_auth() {
    use flotilla_codec::{Codec, CodecError};
    use flotilla_runtime::registry::RegistryConfig;
    use secrecy::SecretString;

    let dir = std::env::temp_dir().join(format!("flotilla-tls-registry-{}", Uuid::new_v4()));
    let certs = TestCertificates::generate(&dir, "worker");
    let url = guarded_registry(&certs).await;
    let topic = flotilla_tests::unique("tls-registry");
    let request =
        flotilla_contracts::WorkflowRunRequest::new(Uuid::new_v4(), "w", json!({"a": 1})).unwrap();
    let settings = |user_info: &str, ca: &std::path::Path| RegistryConfig {
        schema_registry_basic_auth_user_info: Some(SecretString::from(user_info)),
        schema_registry_ssl_ca_location: Some(ca.to_owned()),
        ..RegistryConfig::new(&url)
    };

    let good = settings("flotilla:s3cret:with-colon", &certs.ca);
    good.validate().unwrap();
    let codec = Codec::from_config(&good).unwrap();
    let bytes = tokio::time::timeout(Duration::from_secs(30), codec.encode(&topic, &request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(bytes[0], 0, "Confluent-framed Avro");
    let decoded: flotilla_contracts::WorkflowRunRequest = codec.decode(&bytes).await.unwrap();
    assert_eq!(decoded, request);

    // Wrong credentials and an untrusted certificate are outages (the
    // message waits), never a verdict on the message.
    for (user_info, ca) in [
        ("flotilla:wrong", certs.ca.as_path()),
        ("flotilla:s3cret:with-colon", certs.other_ca.as_path()),
    ] {
        let codec = Codec::from_config(&settings(user_info, ca)).unwrap();
        let refused = tokio::time::timeout(
            Duration::from_secs(30),
            codec.encode(&flotilla_tests::unique("tls-registry"), &request),
        )
        .await
        .unwrap()
        .unwrap_err();
        assert!(
            matches!(refused, CodecError::RegistryUnavailable(_)),
            "{user_info} with {}: {refused:?}",
            ca.display()
        );
    }

    // The Python client through the same registry: a request submitted
    // Avro, an event encoded and decoded; wrong credentials an outage.
    flotilla_tests::create_topic(&topic, 1).await.unwrap();
    let (python, examples) = flotilla_tests::examples_python();
    let package = examples.parent().unwrap().join("clients/python");
    let mut command = Command::new(python);
    command
        .args(["-c", PYTHON_THROUGH_THE_GUARDED_REGISTRY, &url, &topic])
        .arg(&certs.ca)
        .env("PYTHONPATH", package)
        .env(
            "KAFKA_BOOTSTRAP_SERVERS",
            flotilla_tests::bootstrap_servers(),
        );
    // Off the runtime: the guarded registry answers on this test's thread.
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::task::spawn_blocking(move || command.output().unwrap()),
    )
    .await
    .expect("the Python client hung")
    .unwrap();
    assert!(
        outcome.status.success(),
        "{}{}",
        String::from_utf8_lossy(&outcome.stdout),
        String::from_utf8_lossy(&outcome.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout).trim(),
        "avro submitted; event decoded; wrong credentials unavailable"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Run by the test above with the registry's URL, a topic and the CA file.
const PYTHON_THROUGH_THE_GUARDED_REGISTRY: &str = r#"
import os, sys, uuid
from datetime import datetime, timezone
from confluent_kafka.serialization import MessageField, SerializationContext
from confluent_kafka.schema_registry.avro import AvroSerializer
from flotilla_client import EventType, KafkaSubmitter, Unavailable, WorkflowRunEvent, event_to_avro_fields
from flotilla_client.events import EventDecoder, registry_client
from flotilla_client.wire import schema_text

url, topic, ca = sys.argv[1:4]
good = {"basic.auth.user.info": "flotilla:s3cret:with-colon", "ssl.ca.location": ca}
submitter = KafkaSubmitter(os.environ["KAFKA_BOOTSTRAP_SERVERS"], registry_url=url, topic=topic,
                           registry_config=good)
receipt = submitter.submit("w", {"a": 1}, timeout=30)
assert receipt.offset is not None
print("avro submitted;", end=" ")

event = WorkflowRunEvent(event_id=uuid.uuid4(), job_id=uuid.uuid4(), sequence=1, type=EventType.ACCEPTED,
                         workflow_name="w", attempt=0, occurred_at=datetime.now(timezone.utc),
                         workflow_version=2)
serializer = AvroSerializer(registry_client(url, good), schema_text("WorkflowRunEvent"))
value = serializer(event_to_avro_fields(event), SerializationContext(topic + "-events", MessageField.VALUE))

class Record:
    def value(self): return value
    def topic(self): return topic + "-events"

assert EventDecoder(url, good).decode(Record()) == event
print("event decoded;", end=" ")

wrong = KafkaSubmitter(os.environ["KAFKA_BOOTSTRAP_SERVERS"], registry_url=url, topic=topic,
                       registry_config={**good, "basic.auth.user.info": "flotilla:wrong"})
try:
    wrong.submit("w", {"a": 1}, timeout=30)
    raise SystemExit("wrong credentials were accepted")
except Unavailable:
    print("wrong credentials unavailable")
"#;
