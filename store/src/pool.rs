//! The Postgres pool, its settings, and the embedded migrations (from `migrations/`).

use std::time::Duration;

use clap::Args;
use secrecy::{ExposeSecret as _, SecretString};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;

/// Every migration of `migrations/`, embedded at build time.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Connections one process keeps open, unless configured.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;
/// How long a caller waits for a pooled connection, unless configured.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the database is and how many connections to keep.
#[derive(Debug, Clone, Args)]
pub struct DatabaseConfig {
    /// Postgres connection string (a secret: never printed).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_parser = parse_secret)]
    pub database_url: SecretString,

    /// Most connections this process keeps open.
    #[arg(long, env = "FLOTILLA_DB_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..=10_000))]
    pub db_max_connections: u32,

    /// How long to wait for a connection from the pool.
    #[arg(long, env = "FLOTILLA_DB_ACQUIRE_TIMEOUT", default_value_t = DEFAULT_ACQUIRE_TIMEOUT.into(), value_parser = parse_acquire_timeout)]
    pub db_acquire_timeout: humantime::Duration,
}

impl DatabaseConfig {
    /// Settings for `url` with the default pool size and timeout.
    #[must_use]
    pub fn new(url: &str) -> Self {
        Self {
            database_url: SecretString::from(url),
            db_max_connections: DEFAULT_MAX_CONNECTIONS,
            db_acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT.into(),
        }
    }
}

/// clap's parser for secret values: kept out of `Debug` output from the start.
///
/// # Errors
/// Never; the signature is clap's.
pub fn parse_secret(value: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(value))
}

/// A wait for a pooled connection: more than nothing, at most an hour.
fn parse_acquire_timeout(text: &str) -> Result<humantime::Duration, String> {
    let parsed = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if parsed.is_zero() || parsed > Duration::from_secs(3600) {
        return Err(format!(
            "{} is out of range: it must be above 0s and at most 1h",
            humantime::format_duration(parsed)
        ));
    }
    Ok(parsed.into())
}

/// Opens a pool and checks that the database answers.
///
/// # Errors
/// The URL is malformed or the database does not answer in time.
pub async fn connect(config: &DatabaseConfig) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(config.db_max_connections)
        .acquire_timeout(*config.db_acquire_timeout)
        .connect(config.database_url.expose_secret())
        .await
}

/// Applies every pending migration; a database already up to date is left alone.
///
/// # Errors
/// A migration fails, or one already applied was changed since.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(pool).await
}
