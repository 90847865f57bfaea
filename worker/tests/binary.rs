//! The worker binary: `migrate` applies the migrations, the worker starts,
//! connects, and exits 0 on SIGTERM, and a blank worker id is refused.

use std::process::Command;
use std::time::Duration;

use flotilla_tests::process::Running;
use sqlx::PgPool;

const BINARY: &str = env!("CARGO_BIN_EXE_flotilla-worker");

/// The URL of the database `pool` is connected to (a per-test database).
async fn url_of(pool: &PgPool) -> String {
    let name: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(pool)
        .await
        .unwrap();
    let base = std::env::var("DATABASE_URL").unwrap();
    let (server, _) = base.rsplit_once('/').unwrap();
    format!("{server}/{name}")
}

fn worker(database_url: &str) -> Command {
    let mut command = Command::new(BINARY);
    command
        .env("DATABASE_URL", database_url)
        .env(
            "KAFKA_BOOTSTRAP_SERVERS",
            flotilla_tests::bootstrap_servers(),
        )
        .env("FLOTILLA_WORKER_ID", "binary-test")
        .env("NO_COLOR", "1");
    command
}

#[sqlx::test(migrations = false)]
async fn migrate_subcommand_applies_the_migrations(pool: PgPool) {
    let url = url_of(&pool).await;
    let mut migrate = Command::new(BINARY);
    migrate.arg("migrate").env("DATABASE_URL", &url);
    let mut running = Running::start(migrate);
    let status = running.wait(Duration::from_secs(60));
    assert!(
        status.success(),
        "migrate failed:\n{}",
        running.output.join("\n")
    );
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'workflow_run'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 1);
}

#[sqlx::test(migrator = "flotilla_worker::db::MIGRATOR")]
async fn worker_exits_zero_on_sigterm(pool: PgPool) {
    let mut running = Running::start(worker(&url_of(&pool).await));
    running.wait_for_line("worker ready", Duration::from_secs(60));
    let status = running.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit {status}:\n{}",
        running.output.join("\n")
    );
    assert!(
        running
            .output
            .iter()
            .any(|l| l.contains("shutdown signal received"))
    );
}

#[test]
fn blank_worker_id_is_refused() {
    let mut command = worker("postgres://127.0.0.1:1/none");
    command.env("FLOTILLA_WORKER_ID", "   ");
    let mut running = Running::start(command);
    let status = running.wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        running
            .output
            .iter()
            .any(|l| l.contains("the worker id is blank")),
        "{}",
        running.output.join("\n")
    );
}

#[test]
fn unreachable_database_fails_start_up_with_the_reason() {
    let mut command = worker("postgres://postgres@127.0.0.1:1/none");
    command.env("FLOTILLA_DB_ACQUIRE_TIMEOUT", "2s");
    let mut running = Running::start(command);
    let status = running.wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        running
            .output
            .iter()
            .any(|l| l.contains("connecting to Postgres")),
        "{}",
        running.output.join("\n")
    );
}
