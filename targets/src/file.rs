//! The targets file (`FLOTILLA_TARGETS_FILE`):
//! `targets: {<name>: {kind: http, base_url: …, timeout_ms: …, max_concurrent: …}}`
//! or `{kind: kafka, request_topic: …, reply_topic: …, encoding: avro|json, timeout_ms: …,
//! max_concurrent: …}` (for a Kafka target, requests awaiting replies across
//! the fleet; for an HTTP one, calls in flight from one worker),
//! `max_response_bytes` and `error_body_bytes` (how much of a failed
//! answer's body error texts keep; none unless set),
//! plus for HTTPS `ca_file`, `client_certificate` and `client_key`, and
//! `headers` whose values are literal or come `from_env` / `from_file` (for
//! credentials: the file itself then holds no secret), `secrets` from the
//! same sources that steps' headers name as `{secrets.<name>}`, the `verb`
//! of steps that name none, and for HTTP a fleet-wide `rate_limit`
//! (`100/s`, `1000/m`).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::http::{DEFAULT_MAX_RESPONSE_BYTES, HttpTarget, HttpTls};
use super::{DEFAULT_MAX_CONCURRENT, Targets};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetsFile {
    targets: BTreeMap<String, TargetConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
enum TargetConfig {
    Http {
        base_url: String,
        #[serde(default)]
        timeout_ms: Option<u64>,
        #[serde(default)]
        max_concurrent: Option<usize>,
        /// Largest response body accepted (a defect above it).
        #[serde(default)]
        max_response_bytes: Option<usize>,
        /// Bytes of a failed answer's body kept in error texts (which
        /// reach rows and events); none unless set.
        #[serde(default)]
        error_body_bytes: usize,
        /// Headers sent on every call (an `Authorization`, an API key).
        #[serde(default)]
        headers: BTreeMap<String, HeaderValueSource>,
        /// Values steps' headers name as `{secrets.<name>}`: an API key
        /// one workflow sends as `Authorization: Bearer {secrets.key}`.
        #[serde(default)]
        secrets: BTreeMap<String, HeaderValueSource>,
        /// The verb of the steps that name none (default `POST`).
        #[serde(default)]
        verb: Option<flotilla_workflow::Verb>,
        /// PEM file of extra certificate authorities for this target.
        #[serde(default)]
        ca_file: Option<PathBuf>,
        /// PEM client certificate for mutual TLS, with `client_key`.
        #[serde(default)]
        client_certificate: Option<PathBuf>,
        #[serde(default)]
        client_key: Option<PathBuf>,
        /// Accept any certificate: logged loudly at every start.
        #[serde(default)]
        insecure_skip_verify: bool,
        /// Statuses retried although they would be final (400 to 599):
        /// `[500]` for a service whose 500s pass.
        #[serde(default)]
        retry_statuses: Vec<u16>,
        /// At most this many calls begin in any window of the period,
        /// across the fleet: `100/s`, `1000/m`, `50/h`.
        #[serde(default)]
        rate_limit: Option<String>,
    },
    /// A pair of topics: requests leave through the outbox, replies come
    /// back on `reply_topic`.
    Kafka {
        request_topic: String,
        reply_topic: String,
        /// `avro` or `json`; unset: the fleet's (Avro with a registry).
        #[serde(default)]
        encoding: Option<super::kafka::Encoding>,
        /// How long a request waits for its reply (default 30 s).
        #[serde(default)]
        timeout_ms: Option<u64>,
        /// Most requests awaiting replies at once, across the fleet (a
        /// Kafka step holds no worker while it waits); unset: no cap.
        #[serde(default)]
        max_concurrent: Option<usize>,
    },
}

/// Where a header's value comes from. Values from the environment or a file
/// keep secrets out of the targets file (and out of a ConfigMap).
#[derive(Debug, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
enum HeaderValueSource {
    Literal(String),
    FromEnv { from_env: String },
    FromFile { from_file: PathBuf },
}

impl HeaderValueSource {
    fn resolve(&self) -> Result<String, String> {
        match self {
            Self::Literal(value) => Ok(value.clone()),
            Self::FromEnv { from_env } => std::env::var(from_env)
                .map_err(|_| format!("environment variable {from_env} is not set")),
            Self::FromFile { from_file } => std::fs::read_to_string(from_file)
                .map(|text| text.trim_end_matches(['\r', '\n']).to_owned())
                .map_err(|e| format!("cannot read {}: {e}", from_file.display())),
        }
    }
}

/// The headers of a target, resolved; a problem names the header, never its value.
fn resolve_headers(
    headers: &BTreeMap<String, HeaderValueSource>,
) -> Result<reqwest::header::HeaderMap, String> {
    let mut map = reqwest::header::HeaderMap::new();
    for (name, source) in headers {
        let value = source
            .resolve()
            .map_err(|e| format!("header {name}: {e}"))?;
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header {name:?} is not a valid header name"))?;
        let value = reqwest::header::HeaderValue::from_str(&value)
            .map_err(|_| format!("header {name}: the value is not a valid header value"))?;
        map.insert(name, value);
    }
    Ok(map)
}

/// The secrets of a target, resolved; a problem names the secret, never
/// its value.
fn resolve_secrets(
    secrets: &BTreeMap<String, HeaderValueSource>,
) -> Result<BTreeMap<String, reqwest::header::HeaderValue>, String> {
    let mut resolved = BTreeMap::new();
    for (name, source) in secrets {
        if !flotilla_workflow::http::is_secret_name(name) {
            return Err(format!(
                "secret {name:?}: a name is letters, digits, '_' and '-'"
            ));
        }
        let value = source
            .resolve()
            .map_err(|e| format!("secret {name}: {e}"))?;
        let value = reqwest::header::HeaderValue::from_str(&value)
            .map_err(|_| format!("secret {name}: the value cannot go in a header"))?;
        resolved.insert(name.clone(), value);
    }
    Ok(resolved)
}

/// Default per-call timeout of an http target without `timeout_ms`.
const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// A targets file that cannot be used, naming the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum TargetsFileError {
    #[error("reading targets file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("targets file {path}: {source}")]
    Parse {
        path: String,
        source: serde_yaml_ng::Error,
    },
    #[error("targets file {path}: target {name}: {reason}")]
    Target {
        path: String,
        name: String,
        reason: String,
    },
}

/// What Kafka refuses in a topic name, if anything: empty, over 249
/// characters, or a character other than ASCII letters, digits, `.`, `_`
/// and `-`.
fn topic_name_problem(topic: &str) -> Option<String> {
    if topic.is_empty() || topic == "." || topic == ".." {
        return Some(format!("{topic:?} is not a topic name"));
    }
    if topic.len() > 249 {
        return Some(format!("{} characters, over Kafka's 249", topic.len()));
    }
    topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .map(|c| format!("{c:?} is not allowed in a topic name"))
}

/// The names of the targets the file at `path` declares, its shape checked
/// but nothing built: what an offline check of a definition needs.
///
/// # Errors
/// The file cannot be read or parsed, with the path and the reason.
pub fn names(path: &Path) -> Result<HashSet<String>, TargetsFileError> {
    Ok(read(path)?.targets.into_keys().collect())
}

/// The targets file at `path`, parsed.
fn read(path: &Path) -> Result<TargetsFile, TargetsFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| TargetsFileError::Read {
        path: path.display().to_string(),
        source,
    })?;
    serde_yaml_ng::from_str(&text).map_err(|source| TargetsFileError::Parse {
        path: path.display().to_string(),
        source,
    })
}

/// Reads the targets file and adds its targets to `targets`.
///
/// # Errors
/// The file cannot be read or parsed, with the path and the reason.
pub fn load(path: &Path, targets: &mut Targets) -> Result<(), TargetsFileError> {
    let shown = || path.display().to_string();
    let file = read(path)?;
    for (name, config) in file.targets {
        let refused = |reason: String| TargetsFileError::Target {
            path: shown(),
            name: name.clone(),
            reason,
        };
        match config {
            TargetConfig::Kafka {
                request_topic,
                reply_topic,
                encoding,
                timeout_ms,
                max_concurrent,
            } => {
                for (field, topic) in [
                    ("request_topic", &request_topic),
                    ("reply_topic", &reply_topic),
                ] {
                    if let Some(problem) = topic_name_problem(topic) {
                        return Err(refused(format!("{field}: {problem}")));
                    }
                }
                if request_topic == reply_topic {
                    return Err(refused(
                        "request_topic and reply_topic are the same topic".into(),
                    ));
                }
                let timeout = match timeout_ms {
                    None => super::kafka::DEFAULT_KAFKA_TIMEOUT,
                    Some(0) => return Err(refused("timeout_ms must be above 0".into())),
                    Some(ms) => Duration::from_millis(ms),
                };
                if max_concurrent == Some(0) {
                    return Err(refused("max_concurrent must be above 0".into()));
                }
                targets.register_kafka(
                    name.clone(),
                    super::kafka::KafkaTarget {
                        request_topic,
                        reply_topic,
                        encoding,
                        timeout,
                        max_concurrent,
                    },
                );
            }
            TargetConfig::Http {
                base_url,
                timeout_ms,
                max_concurrent,
                max_response_bytes,
                error_body_bytes,
                headers,
                secrets,
                verb,
                ca_file,
                client_certificate,
                client_key,
                insecure_skip_verify,
                retry_statuses,
                rate_limit,
            } => {
                if let Some(rate) = rate_limit {
                    let rate = rate
                        .parse::<super::RateLimit>()
                        .map_err(|e| refused(format!("rate_limit: {e}")))?;
                    targets.set_rate_limit(name.clone(), rate);
                }
                if let Some(status) = retry_statuses.iter().find(|s| !(400..=599).contains(*s)) {
                    return Err(refused(format!(
                        "retry_statuses: {status} is not an HTTP status of 400 to 599"
                    )));
                }
                let timeout = timeout_ms.map_or(DEFAULT_HTTP_TIMEOUT, Duration::from_millis);
                let limit = max_response_bytes.unwrap_or(DEFAULT_MAX_RESPONSE_BYTES);
                let client_identity = match (client_certificate, client_key) {
                    (Some(certificate), Some(key)) => Some((certificate, key)),
                    (None, None) => None,
                    _ => {
                        return Err(refused(
                            "client_certificate and client_key go together".into(),
                        ));
                    }
                };
                if insecure_skip_verify {
                    tracing::warn!(
                        target_name = %name,
                        base_url,
                        "insecure_skip_verify: TLS certificates of this target are NOT checked; anyone on the network path can read and change its calls"
                    );
                }
                let tls = HttpTls {
                    ca_file,
                    client_identity,
                    insecure_skip_verify,
                };
                let headers = resolve_headers(&headers).map_err(refused)?;
                let secrets = resolve_secrets(&secrets).map_err(refused)?;
                let target = HttpTarget::configured(&base_url, timeout, limit, &tls, headers)
                    .map_err(refused)?
                    .keep_error_body(error_body_bytes)
                    .retry_statuses(retry_statuses)
                    .default_verb(verb.unwrap_or(flotilla_workflow::Verb::Post))
                    .secrets(secrets);
                targets.register(
                    name,
                    Arc::new(target),
                    max_concurrent.unwrap_or(DEFAULT_MAX_CONCURRENT),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(yaml: &str) -> BTreeMap<String, HeaderValueSource> {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn header_values_come_from_the_file_the_environment_or_a_secret_file() {
        let secret = std::env::temp_dir().join(format!("flotilla-header-{}", std::process::id()));
        std::fs::write(&secret, "Bearer from-a-file\n").unwrap();
        // A variable nobody sets, for the missing case; PATH for a set one.
        let variable = format!("FLOTILLA_TEST_UNSET_HEADER_{}", std::process::id());
        let yaml = format!(
            "X-Plain: visible\nAuthorization: {{from_file: {}}}\nX-Api-Key: {{from_env: PATH}}\n",
            secret.display()
        );
        let headers = resolve_headers(&sources(&yaml)).unwrap();
        assert_eq!(headers["x-plain"], "visible");
        assert_eq!(headers["authorization"], "Bearer from-a-file");
        assert_eq!(
            headers["x-api-key"],
            std::env::var("PATH").unwrap().as_str()
        );

        let missing = resolve_headers(&sources(&format!(
            "Authorization: {{from_env: {variable}}}\n"
        )))
        .unwrap_err();
        assert!(missing.contains("header Authorization"), "{missing}");
        assert!(missing.contains(&variable), "{missing}");
        std::fs::remove_file(secret).unwrap();
    }

    fn load_text(yaml: &str) -> Result<Targets, TargetsFileError> {
        let path = std::env::temp_dir().join(format!(
            "flotilla-targets-{}-{}.yaml",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        std::fs::write(&path, yaml).unwrap();
        let mut targets = Targets::default();
        let loaded = load(&path, &mut targets).map(|()| targets);
        std::fs::remove_file(path).unwrap();
        loaded
    }

    #[test]
    fn a_kafka_target_loads_with_its_topics_and_a_wrong_one_is_refused_by_name() {
        let targets = load_text(
            "targets:\n  fraud:\n    kind: kafka\n    request_topic: fraud-requests\n    reply_topic: fraud-replies\n    encoding: avro\n    timeout_ms: 1500\n    max_concurrent: 4\n",
        )
        .unwrap();
        let fraud = targets.kafka("fraud").expect("a Kafka target");
        assert_eq!(
            (fraud.request_topic.as_str(), fraud.reply_topic.as_str()),
            ("fraud-requests", "fraud-replies")
        );
        assert_eq!(fraud.encoding, Some(super::super::kafka::Encoding::Avro));
        assert_eq!(fraud.timeout, Duration::from_millis(1500));
        assert_eq!(fraud.max_concurrent, Some(4));
        assert!(targets.names().contains("fraud"), "definitions may name it");
        assert_eq!(targets.reply_topics(), ["fraud-replies"]);

        for (yaml, expected) in [
            (
                "    request_topic: a b\n    reply_topic: r\n",
                "request_topic: ' ' is not allowed",
            ),
            (
                "    request_topic: same\n    reply_topic: same\n",
                "the same topic",
            ),
            (
                "    request_topic: q\n    reply_topic: r\n    timeout_ms: 0\n",
                "timeout_ms must be above 0",
            ),
            (
                "    request_topic: q\n    reply_topic: r\n    max_concurrent: 0\n",
                "max_concurrent must be above 0",
            ),
            // A knob of HTTP targets only: refused, not ignored.
            (
                "    request_topic: q\n    reply_topic: r\n    max_response_bytes: 4\n",
                "max_response_bytes",
            ),
        ] {
            let refused = load_text(&format!("targets:\n  fraud:\n    kind: kafka\n{yaml}"))
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(refused.contains(expected), "{expected}: {refused}");
        }
    }

    #[test]
    fn an_http_target_s_rate_limit_loads_and_a_malformed_one_is_refused_by_name() {
        let http = "targets:\n  crm:\n    kind: http\n    base_url: http://crm.test\n";
        let targets = load_text(&format!("{http}    rate_limit: 100/s\n")).unwrap();
        assert_eq!(targets.rate_limit("crm").unwrap().to_string(), "100/s");
        assert_eq!(load_text(http).unwrap().rate_limit("crm"), None);
        let refused = load_text(&format!("{http}    rate_limit: lots\n"))
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("crm") && refused.contains("rate_limit"),
            "{refused}"
        );
    }

    #[test]
    fn an_http_target_s_verb_and_secrets_load_and_a_bad_secret_is_refused_by_name() {
        let http = "targets:\n  shop:\n    kind: http\n    base_url: http://shop.test\n";
        let targets = load_text(&format!(
            "{http}    verb: GET\n    secrets:\n      key: {{from_env: PATH}}\n"
        ))
        .unwrap();
        assert_eq!(targets.default_verb("shop"), flotilla_workflow::Verb::Get);
        assert_eq!(
            load_text(http).unwrap().default_verb("shop"),
            flotilla_workflow::Verb::Post
        );
        for (secrets, says) in [
            ("      bad/name: x\n", "bad/name"),
            (
                "      gone: {from_env: FLOTILLA_TEST_UNSET_SECRET}\n",
                "secret gone",
            ),
            ("      broken: \"a\\nb-s3cret\"\n", "secret broken"),
        ] {
            let refused = load_text(&format!("{http}    secrets:\n{secrets}"))
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(refused.contains(says), "{refused}");
            assert!(!refused.contains("s3cret"), "{refused}");
        }
    }

    #[test]
    fn a_bad_header_value_is_refused_without_echoing_it() {
        let refused = resolve_headers(&sources("Authorization: \"Bearer s3cret\\nInjected: 1\"\n"))
            .unwrap_err();
        assert!(refused.contains("authorization"), "{refused}");
        assert!(!refused.contains("s3cret"), "{refused}");
    }
}
