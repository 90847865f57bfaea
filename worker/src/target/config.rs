//! The targets file (`FLOTILLA_TARGETS_FILE`):
//! `targets: {<name>: {kind: http, base_url: …, timeout_ms: …, max_concurrent: …}}`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::http::{DEFAULT_MAX_RESPONSE_BYTES, HttpTarget};
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
    },
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

/// Reads the targets file and adds its targets to `targets`.
///
/// # Errors
/// The file cannot be read or parsed, with the path and the reason.
pub fn load(path: &Path, targets: &mut Targets) -> Result<(), TargetsFileError> {
    let shown = || path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TargetsFileError::Read {
        path: shown(),
        source,
    })?;
    let file: TargetsFile =
        serde_yaml_ng::from_str(&text).map_err(|source| TargetsFileError::Parse {
            path: shown(),
            source,
        })?;
    for (name, config) in file.targets {
        match config {
            TargetConfig::Http {
                base_url,
                timeout_ms,
                max_concurrent,
                max_response_bytes,
            } => {
                let timeout = timeout_ms.map_or(DEFAULT_HTTP_TIMEOUT, Duration::from_millis);
                let limit = max_response_bytes.unwrap_or(DEFAULT_MAX_RESPONSE_BYTES);
                let target = HttpTarget::new(&base_url, timeout, limit).map_err(|reason| {
                    TargetsFileError::Target {
                        path: shown(),
                        name: name.clone(),
                        reason,
                    }
                })?;
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
