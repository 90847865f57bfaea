//! The Postgres pool and the embedded migrations (from `migrations/`).

use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;

use crate::config::DatabaseConfig;

/// Every migration of `migrations/`, embedded at build time.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Opens a pool and checks that the database answers.
///
/// # Errors
/// The URL is malformed or the database does not answer in time.
pub async fn connect(config: &DatabaseConfig) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(config.db_max_connections)
        .acquire_timeout(config.db_acquire_timeout)
        .connect(&config.database_url)
        .await
}

/// Applies every pending migration; a database already up to date is left alone.
///
/// # Errors
/// A migration fails, or one already applied was changed since.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(pool).await
}
