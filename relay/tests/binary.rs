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

#[test]
fn settings_that_make_no_sense_are_refused_at_start_up_naming_the_flag() {
    for (variable, value, flag) in [
        ("FLOTILLA_RELAY_BATCH_SIZE", "0", "--batch-size"),
        ("FLOTILLA_RELAY_LEASE", "0s", "--lease"),
        (
            "FLOTILLA_RELAY_IDLE_POLL_MAX",
            "999years",
            "--idle-poll-max",
        ),
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-relay"));
        command
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
            .env(variable, value);
        let mut running = Running::start(command);
        let status = running.wait(Duration::from_secs(30));
        assert!(!status.success(), "{variable}={value} was accepted");
        assert!(
            running
                .output
                .iter()
                .any(|l| l.contains(flag) && l.contains(value)),
            "{variable}={value}: {}",
            running.output.join("\n")
        );
    }
}
