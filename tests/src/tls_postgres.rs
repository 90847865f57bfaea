//! A Postgres cluster of the test's own that speaks TLS with the test's
//! certificates: initialised in a temporary directory, started on a free
//! port, stopped when dropped. It trusts every local user over TLS, and
//! `certuser` only with a client certificate from the test CA (`cert` auth).
//! Plaintext connections are refused, so a connection that works proves TLS.
//!
//! The server runs as the `postgres` user when the tests run as root (it
//! refuses to run as root).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::postgres_server::{as_server_user, hand_to_server_user};
use crate::process::Running;
use crate::tls::TestCertificates;

/// The user that must present a client certificate.
pub const CERTIFICATE_USER: &str = "certuser";

#[derive(Debug)]
pub struct TlsPostgres {
    pub port: u16,
    pub certificates: TestCertificates,
    dir: PathBuf,
    server: Option<Running>,
}

impl TlsPostgres {
    /// Initialises and starts the cluster; returns once it accepts connections.
    ///
    /// # Panics
    /// The cluster cannot be initialised or does not start within a minute.
    #[must_use]
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "flotilla-tls-postgres-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let data = dir.join("data");
        let certificates = TestCertificates::generate(&dir.join("certs"), CERTIFICATE_USER);
        std::fs::create_dir_all(&data).unwrap();
        // The server's key must be private to the server's user.
        let key = dir.join("certs/server.key");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        hand_to_server_user(&dir);
        let initdb = as_server_user("initdb")
            .args(["--auth=trust", "--username=postgres", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            initdb.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        std::fs::write(
            data.join("pg_hba.conf"),
            format!(
                "local all all trust\nhostssl all {CERTIFICATE_USER} 127.0.0.1/32 cert\nhostssl all all 127.0.0.1/32 trust\n"
            ),
        )
        .unwrap();
        hand_to_server_user(&data);

        let port = crate::free_port();
        let mut command = as_server_user("postgres");
        command
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(&dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "ssl=on",
                "-c",
                "fsync=off",
            ])
            .arg("-c")
            .arg(format!(
                "ssl_cert_file={}",
                certificates.server_certificate.display()
            ))
            .arg("-c")
            .arg(format!("ssl_key_file={}", key.display()))
            .arg("-c")
            .arg(format!("ssl_ca_file={}", certificates.ca.display()));
        let server = Running::start(command);
        let cluster = Self {
            port,
            certificates,
            dir,
            server: Some(server),
        };
        cluster.wait_ready();
        cluster.psql(&format!("CREATE USER {CERTIFICATE_USER} SUPERUSER"));
        cluster
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.try_psql("SELECT 1") {
            assert!(Instant::now() < deadline, "the TLS cluster did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn try_psql(&self, sql: &str) -> bool {
        Command::new("psql")
            .args(["-h"])
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-Atqc", sql])
            .output()
            .is_ok_and(|out| out.status.success())
    }

    fn psql(&self, sql: &str) {
        assert!(self.try_psql(sql), "psql: {sql}");
    }

    /// A URL for `user` over TCP to `localhost` (the certificate's name),
    /// without TLS parameters: add them as the test needs.
    #[must_use]
    pub fn url(&self, user: &str) -> String {
        format!("postgres://{user}@localhost:{}/postgres", self.port)
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.terminate(Duration::from_secs(20));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
