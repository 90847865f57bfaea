//! TLS endpoints made in the tests: a certificate authority of the test's
//! own with a server certificate for `localhost` / `127.0.0.1` and a client
//! certificate, an HTTPS server for an axum router (optionally requiring a
//! client certificate).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// PEM files of a test CA, a server certificate signed by it (for
/// `localhost` and `127.0.0.1`), a client certificate signed by it, and an
/// unrelated CA that must not be trusted.
#[derive(Debug, Clone)]
pub struct TestCertificates {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_certificate: PathBuf,
    pub server_key: PathBuf,
    pub client_certificate: PathBuf,
    pub client_key: PathBuf,
    pub other_ca: PathBuf,
}

impl TestCertificates {
    /// Generates every file into `dir` (created); `client_name` is the
    /// client certificate's common name (Postgres maps it to a user).
    ///
    /// # Panics
    /// The files cannot be generated or written.
    #[must_use]
    pub fn generate(dir: &Path, client_name: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ca = authority("Flotilla test CA");
        let other = authority("A CA nobody trusts");

        let server_key = KeyPair::generate().unwrap();
        let mut server =
            CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let server_certificate = server.signed_by(&server_key, &ca).unwrap();

        let client_key = KeyPair::generate().unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(DnType::CommonName, client_name);
        let client_certificate = client.signed_by(&client_key, &ca).unwrap();

        Self {
            ca: write("ca.pem", &ca.pem()),
            server_certificate: write("server.pem", &server_certificate.pem()),
            server_key: write("server.key", &server_key.serialize_pem()),
            client_certificate: write("client.pem", &client_certificate.pem()),
            client_key: write("client.key", &client_key.serialize_pem()),
            other_ca: write("other-ca.pem", &other.pem()),
            dir: dir.to_owned(),
        }
    }

    /// A server configuration presenting the server certificate; with
    /// `require_client_certificate`, only clients with a certificate from
    /// the test CA get through the handshake.
    ///
    /// # Panics
    /// The files do not make a configuration.
    #[must_use]
    pub fn server_config(&self, require_client_certificate: bool) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if require_client_certificate {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in certificates(&self.ca) {
                roots.add(certificate).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        builder
            .with_single_cert(
                certificates(&self.server_certificate),
                PrivateKeyDer::from_pem_file(&self.server_key).unwrap(),
            )
            .unwrap()
    }
}

fn authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn certificates(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A listener that completes a TLS handshake before handing a connection
/// to axum; connections whose handshake fails are dropped.
struct TlsListener {
    listener: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, peer)) = self.listener.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// Serves `router` over HTTPS on a free port; the URL names `localhost`
/// (the name in the server certificate).
///
/// # Panics
/// No port can be bound.
pub async fn serve_https(router: axum::Router, config: rustls::ServerConfig) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let listener = TlsListener {
        listener,
        acceptor: TlsAcceptor::from(Arc::new(config)),
    };
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("https://localhost:{port}")
}
