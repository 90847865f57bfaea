//! Running a Flotilla binary as a child process: wait for a line that says it
//! is ready, send it SIGTERM, and wait for it to exit, each under a deadline.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A workspace binary built beside the running program (`<target>/<profile>/`):
/// tests (which run from `<profile>/deps/`) and the benchmark run other
/// packages' binaries (the worker, the relay, the CLI) from there.
///
/// # Panics
/// The binary is not built.
#[must_use]
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the program knows where it is");
    let dir = exe.parent().expect("the program runs from a directory");
    // Beside it (a binary such as flotilla-bench), or one level up (a test).
    let path = [Some(dir), dir.parent()]
        .into_iter()
        .flatten()
        .map(|dir| dir.join(name))
        .find(|path| path.exists());
    path.unwrap_or_else(|| {
        panic!(
            "{name} is not built beside {}: run through scripts/test or scripts/bench, which build every binary",
            exe.display()
        )
    })
}

/// `binary` pointed at the test services: the database at `database_url`
/// and the broker, with plain log lines.
#[must_use]
pub fn with_services(binary: &str, database_url: &str) -> Command {
    let mut command = Command::new(binary);
    command
        .env("DATABASE_URL", database_url)
        .env("KAFKA_BOOTSTRAP_SERVERS", crate::bootstrap_servers())
        .env("NO_COLOR", "1");
    command
}

/// A started binary and the lines it has printed so far.
#[derive(Debug)]
pub struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    pub output: Vec<String>,
}

impl Running {
    /// Starts `command` with stdout and stderr captured.
    ///
    /// # Panics
    /// The binary cannot be started.
    #[must_use]
    pub fn start(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("starting the binary");
        let (sender, lines) = mpsc::channel();
        for pipe in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let sender = sender.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Self {
            child,
            lines,
            output: Vec::new(),
        }
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, once the process has exited on its own.
    ///
    /// # Panics
    /// The child cannot be polled.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().expect("polling the child")?;
        self.take_last_lines();
        Some(status)
    }

    /// The process's peak resident memory so far in KiB (`VmHWM`), while it runs.
    #[must_use]
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Waits until a printed line contains `needle`.
    ///
    /// # Panics
    /// No such line within `timeout` (the output so far is shown).
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.output.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => panic!(
                    "no line containing {needle:?} within {timeout:?}; output:\n{}",
                    self.output.join("\n")
                ),
            }
        }
    }

    /// Waits until a printed line satisfies `matches`, and returns it.
    ///
    /// # Panics
    /// No such line within `timeout` (the output so far is shown).
    pub fn wait_for_matching(
        &mut self,
        what: &str,
        matches: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = matches(&line);
                    self.output.push(line.clone());
                    if found {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line of {what} within {timeout:?}; output:\n{}",
                    self.output.join("\n")
                ),
            }
        }
    }

    /// Takes in what the process printed so far, and returns every line.
    pub fn output_so_far(&mut self) -> &[String] {
        self.output.extend(self.lines.try_iter());
        &self.output
    }

    /// The value of `field` (as `field=value`) on the first printed line
    /// containing `message`, among the lines read so far.
    #[must_use]
    pub fn logged(&self, message: &str, field: &str) -> Option<String> {
        let prefix = format!("{field}=");
        self.output
            .iter()
            .filter(|line| line.contains(message))
            .find_map(|line| {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix(&prefix))
                    .map(|value| value.trim_matches('"').to_owned())
            })
    }

    /// Sends SIGTERM and waits for the exit.
    ///
    /// # Panics
    /// The process does not exit within `timeout` (it is killed then).
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "sending SIGTERM to {pid}");
        self.wait(timeout)
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the process.
    ///
    /// # Panics
    /// The signal cannot be sent.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Kills the process at once (SIGKILL): no shutdown, no goodbye to the broker.
    ///
    /// # Panics
    /// The process cannot be killed or waited for.
    pub fn kill(&mut self) {
        self.child.kill().expect("killing the child");
        self.child.wait().expect("reaping the child");
        self.take_last_lines();
    }

    /// After the exit: the lines still on their way from the pipes' reader
    /// threads (which may not have read the last ones yet when the process
    /// is reaped), until both pipes are closed, or for at most 5 s (a
    /// child of the process may hold them open).
    fn take_last_lines(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.output.push(line),
                Err(_) => return,
            }
        }
    }

    /// Waits for the process to exit on its own.
    ///
    /// # Panics
    /// It does not exit within `timeout` (it is killed then).
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("polling the child") {
                self.take_last_lines();
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "the process did not exit within {timeout:?}; output:\n{}",
                    self.output.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs `command` and checks it refuses to start, with a message naming
/// `flag` and the `value` it was given.
///
/// # Panics
/// It started, or its output does not name the flag and value.
pub fn assert_refused(command: Command, flag: &str, value: &str) {
    let mut running = Running::start(command);
    let status = running.wait(Duration::from_secs(30));
    assert!(!status.success(), "{flag} {value} was accepted");
    assert!(
        running
            .output
            .iter()
            .any(|l| l.contains(flag) && l.contains(value)),
        "{flag} {value}: {}",
        running.output.join("\n")
    );
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `command` and waits, off the async runtime, until it prints a
/// line containing `needle` (at most a minute).
///
/// # Panics
/// No such line in time (the output so far is shown).
pub async fn started(command: Command, needle: &'static str) -> Running {
    tokio::task::spawn_blocking(move || {
        let mut running = Running::start(command);
        running.wait_for_line(needle, Duration::from_secs(60));
        running
    })
    .await
    .expect("starting the process panicked")
}
