//! A test broker of a test's own: tansu on a free port with its own SQLite
//! file, so a test can restart it (its storage survives) or start it with
//! other flags (`--authentication`) without disturbing the tests beside it.
//! Needs `FLOTILLA_TANSU_BIN` (exported by `scripts/services env`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::Running;

#[derive(Debug)]
pub struct OwnBroker {
    /// Where it listens (plaintext).
    pub address: String,
    /// What it tells clients to connect to (its address, or a proxy's).
    pub advertised: String,
    bin: PathBuf,
    data: PathBuf,
    running: Running,
}

/// The tansu binary, when `scripts/services` says where it is.
#[must_use]
pub fn binary() -> Option<PathBuf> {
    std::env::var_os("FLOTILLA_TANSU_BIN").map(PathBuf::from)
}

impl OwnBroker {
    /// Starts tansu from `bin` on a free port, its storage under `dir`,
    /// advertising `advertised` (its own address when `None`), with `extra`
    /// flags; returns once the port answers.
    ///
    /// # Panics
    /// The broker does not answer within a minute.
    #[must_use]
    pub fn start(bin: &Path, dir: &Path, advertised: Option<&str>, extra: &[&str]) -> Self {
        Self::start_on(
            bin,
            dir,
            &format!("127.0.0.1:{}", crate::free_port()),
            advertised,
            extra,
        )
    }

    /// As [`OwnBroker::start`], listening on `address` (for a proxy set up
    /// in front of it first).
    ///
    /// # Panics
    /// The broker does not answer within a minute.
    #[must_use]
    pub fn start_on(
        bin: &Path,
        dir: &Path,
        address: &str,
        advertised: Option<&str>,
        extra: &[&str],
    ) -> Self {
        let data = dir.join("broker");
        std::fs::create_dir_all(&data).unwrap();
        let advertised = advertised.unwrap_or(address).to_owned();
        let running = spawn(bin, &data, address, &advertised, extra);
        Self {
            address: address.to_owned(),
            advertised,
            bin: bin.to_owned(),
            data,
            running,
        }
    }

    /// Kills the broker and starts it again on the same storage and port,
    /// with `extra` flags.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.running.kill();
        self.running = spawn(
            &self.bin,
            &self.data,
            &self.address,
            &self.advertised,
            extra,
        );
    }

    /// The `tansu` command, for its other subcommands (`user`, `topic`).
    #[must_use]
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.bin);
        command.current_dir(&self.data);
        command
    }
}

fn spawn(bin: &Path, data: &Path, address: &str, advertised: &str, extra: &[&str]) -> Running {
    let mut command = Command::new(bin);
    command
        .current_dir(data)
        .arg("broker")
        .arg("--listener-url")
        .arg(format!("tcp://{address}"))
        .arg("--advertised-listener-url")
        .arg(format!("tcp://{advertised}"))
        .arg("--storage-engine")
        .arg("sqlite://tansu.db")
        .args(extra);
    let running = Running::start(command);
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(address).is_err() {
        assert!(
            Instant::now() < deadline,
            "the test's broker did not answer"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    running
}
