//! TLS for the HTTP clients (the registry, HTTPS targets, the CLI talking to
//! the API): rustls with the ring provider, the system's roots plus any CA
//! files given, an optional client certificate. (Kafka's TLS is OpenSSL's,
//! inside librdkafka; Postgres's is rustls, inside sqlx.)

use std::path::Path;
use std::sync::Once;

/// A CA or client-certificate file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
}

/// A client builder whose TLS is ready: every HTTP client starts here.
pub fn http_client() -> reqwest::ClientBuilder {
    install_crypto_provider();
    reqwest::Client::builder()
}

/// Makes ring the process's rustls provider (once; a provider installed
/// first by someone else is kept).
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The certificates of a PEM file (a CA bundle).
///
/// # Errors
/// The file cannot be read or holds no certificate.
pub fn certificates(path: &Path) -> Result<Vec<reqwest::Certificate>, TlsError> {
    let pem = read(path)?;
    let certificates =
        reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| invalid(path, &e))?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.display().to_string(),
        });
    }
    Ok(certificates)
}

/// A client identity from a PEM certificate (chain) and a PEM private key.
///
/// # Errors
/// A file cannot be read, or the two do not make an identity.
pub fn identity(certificate: &Path, key: &Path) -> Result<reqwest::Identity, TlsError> {
    let mut pem = read(certificate)?;
    pem.push(b'\n');
    pem.extend(read(key)?);
    reqwest::Identity::from_pem(&pem).map_err(|e| invalid(certificate, &e))
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn invalid(path: &Path, error: &dyn std::error::Error) -> TlsError {
    TlsError::Invalid {
        path: path.display().to_string(),
        reason: error.to_string(),
    }
}

/// Whether `error` (or one of its causes) is a TLS certificate that was
/// refused: a defect of the configuration, not an outage that retrying fixes.
#[must_use]
pub fn is_certificate_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(rustls) = error.downcast_ref::<rustls::Error>() {
            return matches!(
                rustls,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            );
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
        {
            cause = Some(inner);
            continue;
        }
        cause = error.source();
    }
    false
}
