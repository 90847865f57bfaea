//! A throwaway database for the benchmark examples (tests use
//! `#[sqlx::test]`, which does the same per test): created, migrated, and
//! dropped by [`ScratchDatabase::drop_now`].

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// A migrated database of its own on the server `DATABASE_URL` points at.
#[derive(Debug)]
pub struct ScratchDatabase {
    pub pool: PgPool,
    admin: PgPool,
    name: String,
    url: String,
}

impl ScratchDatabase {
    /// Creates and migrates `<prefix>_<uuid>` with a pool of `connections`.
    ///
    /// # Errors
    /// The server cannot be reached, or the database created or migrated.
    pub async fn create(prefix: &str, connections: u32) -> anyhow::Result<Self> {
        let url = crate::service_env("DATABASE_URL");
        let base = url.rsplit_once('/').map_or(url.as_str(), |(base, _)| base);
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await?;
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await?;
        let url = format!("{base}/{name}");
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .connect(&url)
            .await?;
        flotilla_store::migrate(&pool).await?;
        Ok(Self {
            pool,
            admin,
            name,
            url,
        })
    }

    /// Where it is, for processes started beside the pool.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Closes the pool and drops the database, with any connection other
    /// pools still hold on it (an engine keeps a reserved pool of its own).
    ///
    /// # Errors
    /// The database cannot be dropped.
    pub async fn drop_now(self) -> anyhow::Result<()> {
        self.pool.close().await;
        sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .execute(&self.admin)
            .await?;
        Ok(())
    }
}
