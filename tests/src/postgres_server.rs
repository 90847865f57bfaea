//! A Postgres server of a test's own, from the installed server binaries:
//! a data directory initialised in a temporary directory, the server started
//! on a free loopback port and stopped when dropped, `psql` against it.
//!
//! The server runs as the `postgres` user when the tests run as root (it
//! refuses to run as root).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::Running;

/// The directory of the server's binaries (`initdb`, `postgres`, `pg_ctl`,
/// `pg_basebackup`), newest major version first.
///
/// # Panics
/// No server is installed under `/usr/lib/postgresql`.
#[must_use]
pub fn binaries() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's server binaries under /usr/lib/postgresql")
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    found.sort();
    found
        .pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
}

/// Whether this process runs as root.
#[must_use]
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.starts_with(b"0\n"))
}

/// The server program `name` (from [`binaries`]), as `postgres` when this
/// process is root.
#[must_use]
pub fn as_server_user(name: &str) -> Command {
    let program = binaries().join(name);
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// Gives `path` (recursively) to the server's user when this process is root.
///
/// # Panics
/// `chown` fails.
pub fn hand_to_server_user(path: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "chown {}", path.display());
    }
}

/// Runs `command`, panicking with its output when it fails.
///
/// # Panics
/// The command cannot start or exits non-zero.
pub fn run(mut command: Command, what: &str) {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory under the system's temporary one, readable by the
/// server's user.
///
/// # Panics
/// The directory cannot be made.
#[must_use]
pub fn scratch_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    dir
}

/// `initdb` into `data`: trust authentication, superuser `postgres`.
///
/// # Panics
/// initdb fails.
pub fn initdb(data: &Path) {
    std::fs::create_dir_all(data).unwrap();
    hand_to_server_user(data);
    let mut command = as_server_user("initdb");
    command
        .args(["--auth=trust", "--username=postgres", "--no-sync", "-D"])
        .arg(data);
    run(command, "initdb");
}

/// One running server: its data directory, port and process.
#[derive(Debug)]
pub struct Server {
    pub port: u16,
    pub data: PathBuf,
    /// Where its Unix socket is (and `psql` connects).
    socket_dir: PathBuf,
    process: Option<Running>,
}

impl Server {
    /// Starts `postgres` on `data` on a free loopback port, with `settings`
    /// (`name=value`, each passed as `-c`); returns once it accepts
    /// connections (a standby: once it accepts read-only ones).
    ///
    /// # Panics
    /// The server does not answer within a minute.
    #[must_use]
    pub fn start(data: &Path, socket_dir: &Path, settings: &[String]) -> Self {
        let port = crate::free_port();
        let mut command = as_server_user("postgres");
        command
            .arg("-D")
            .arg(data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(socket_dir)
            .args(["-c", "listen_addresses=127.0.0.1"]);
        for setting in settings {
            command.arg("-c").arg(setting);
        }
        let server = Self {
            port,
            data: data.to_owned(),
            socket_dir: socket_dir.to_owned(),
            process: Some(Running::start(command)),
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.try_query("SELECT 1").is_none() {
            assert!(
                Instant::now() < deadline,
                "the server on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The first column of the first row `sql` returns, or `None` when the
    /// server refused it or does not answer.
    #[must_use]
    pub fn try_query(&self, sql: &str) -> Option<String> {
        let out = Command::new("psql")
            .args(["-h"])
            .arg(&self.socket_dir)
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-Atqc", sql])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// [`Server::try_query`] that must work.
    ///
    /// # Panics
    /// The server refused `sql`.
    pub fn query(&self, sql: &str) -> String {
        self.try_query(sql)
            .unwrap_or_else(|| panic!("psql on {}: {sql}", self.port))
    }

    /// Its address on loopback.
    #[must_use]
    pub fn address(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `pg_ctl -m immediate stop`: every server process ends at once, as
    /// when a machine dies; what was not flushed to a standby is lost to it.
    ///
    /// # Panics
    /// pg_ctl fails.
    pub fn stop_immediately(&mut self) {
        let mut command = as_server_user("pg_ctl");
        command
            .args(["-m", "immediate", "-w", "stop", "-D"])
            .arg(&self.data);
        run(command, "pg_ctl stop -m immediate");
        if let Some(mut process) = self.process.take() {
            process.wait(Duration::from_secs(20));
        }
    }

    /// `pg_ctl promote`: a standby becomes a primary; returns once it takes
    /// writes.
    ///
    /// # Panics
    /// pg_ctl fails.
    pub fn promote(&self) {
        let mut command = as_server_user("pg_ctl");
        command.args(["-w", "promote", "-D"]).arg(&self.data);
        run(command, "pg_ctl promote");
    }

    /// Stops the server if it still runs: a fast shutdown (open sessions
    /// are ended), killed if that fails.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let stopped = as_server_user("pg_ctl")
                .args(["-m", "fast", "-w", "-t", "20", "stop", "-D"])
                .arg(&self.data)
                .output()
                .is_ok_and(|out| out.status.success());
            if !stopped {
                process.kill();
            }
            process.wait(Duration::from_secs(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
