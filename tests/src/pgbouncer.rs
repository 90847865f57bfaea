//! PgBouncer (Debian's package) in transaction mode in front of the test
//! server, on a free loopback port, stopped when dropped.
//!
//! It is set up stricter than a production pooler: after every transaction
//! the server connection is reset (`server_reset_query = DISCARD ALL`, run
//! always, not only in session mode). A client that leaves anything on a
//! server connection past its transaction (a prepared statement, named or
//! unnamed, a session setting, a `LISTEN`) or that splits one statement's
//! round trips across two transactions finds it gone at once, every time,
//! instead of only when another client happened to take that server
//! connection in between, as under load.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::postgres_server::hand_to_server_user;
use crate::process::Running;

/// Where Debian installs it.
const BINARY: &str = "/usr/sbin/pgbouncer";

#[derive(Debug)]
pub struct PgBouncer {
    pub port: u16,
    dir: PathBuf,
    process: Option<Running>,
}

impl PgBouncer {
    /// Whether the package is installed (`scripts/build-deps` installs it).
    #[must_use]
    pub fn installed() -> bool {
        std::path::Path::new(BINARY).exists()
    }

    /// Starts it in front of `upstream` (`host:port` of a Postgres server
    /// that trusts `postgres` from loopback), every database passed through.
    ///
    /// # Panics
    /// It is not installed or does not accept connections within 30 s.
    #[must_use]
    pub fn start(upstream: std::net::SocketAddr, pool_size: u32) -> Self {
        assert!(
            Self::installed(),
            "{BINARY} is missing: scripts/build-deps installs Debian's pgbouncer"
        );
        let dir = crate::postgres_server::scratch_dir("flotilla-pgbouncer");
        let port = crate::free_port();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        let config = format!(
            "[databases]\n\
             * = host={host} port={upstream_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/users.txt\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 1000\n\
             server_reset_query = DISCARD ALL\n\
             server_reset_query_always = 1\n\
             logfile = {dir}/pgbouncer.log\n",
            host = upstream.ip(),
            upstream_port = upstream.port(),
            dir = dir.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), config).unwrap();
        hand_to_server_user(&dir);
        // It refuses to run as root, as Postgres does.
        let mut command = if crate::postgres_server::is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--", BINARY]);
            command
        } else {
            Command::new(BINARY)
        };
        command.arg(dir.join("pgbouncer.ini"));
        let bouncer = Self {
            port,
            dir,
            process: Some(Running::start(command)),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen within 30 s: {}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        bouncer
    }

    /// A URL of `database` through it.
    #[must_use]
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// What it logged so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            // SIGTERM (runuser passes it on): an immediate shutdown.
            process.terminate(Duration::from_secs(10));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
