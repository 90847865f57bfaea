//! The relay binary starts, connects, and exits 0 on SIGTERM.

use std::process::Command;
use std::time::Duration;

use flotilla_tests::process::Running;

#[test]
fn relay_exits_zero_on_sigterm() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-relay"));
    command
        .env("DATABASE_URL", flotilla_tests::service_env("DATABASE_URL"))
        .env(
            "KAFKA_BOOTSTRAP_SERVERS",
            flotilla_tests::bootstrap_servers(),
        )
        .env("NO_COLOR", "1");
    let mut running = Running::start(command);
    running.wait_for_line("relay ready", Duration::from_secs(60));
    let status = running.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit {status}:\n{}",
        running.output.join("\n")
    );
}
