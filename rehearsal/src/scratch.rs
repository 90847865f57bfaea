//! A database of its own for each rehearsal: created beside the one the
//! URL names as a copy of a template migrated once per schema version
//! (`flotilla_rehearsal_template_<version>`, kept on the server), and
//! dropped when the rehearsal ends, so nothing of it reaches a fleet's
//! tables and two rehearsals never meet.

use std::str::FromStr as _;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};

use crate::RehearsalError;

/// A scratch database and a pool on it.
#[derive(Debug)]
pub(crate) struct Scratch {
    admin: PgConnectOptions,
    name: String,
    pub(crate) pool: PgPool,
}

/// Serialises the rehearsals of one server while they build the template
/// or copy it (`pg_advisory_lock` key: "flotilla" in ASCII).
const TEMPLATE_LOCK: i64 = 0x666c_6f74_696c_6c61;

impl Scratch {
    /// Creates a database named after a fresh id, as a copy of a template
    /// migrated once per schema version (copying takes a tenth of a second,
    /// migrating several), reached as `url` says, whose role needs CREATEDB.
    pub(crate) async fn create(url: &str) -> Result<Self, RehearsalError> {
        let admin = PgConnectOptions::from_str(url).map_err(RehearsalError::database)?;
        let name = format!("flotilla_rehearsal_{}", uuid::Uuid::new_v4().simple());
        let mut connection = PgConnection::connect_with(&admin)
            .await
            .map_err(RehearsalError::database)?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(TEMPLATE_LOCK)
            .execute(&mut connection)
            .await
            .map_err(RehearsalError::database)?;
        let copied = async {
            let template = template(&admin, &mut connection).await?;
            sqlx::raw_sql(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
                .execute(&mut connection)
                .await
                .map_err(creating_refused)
        }
        .await;
        let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(TEMPLATE_LOCK)
            .execute(&mut connection)
            .await;
        let _ = connection.close().await;
        copied?;
        let scratch = Self {
            pool: PgPoolOptions::new()
                .max_connections(8)
                .connect_lazy_with(admin.clone().database(&name)),
            admin,
            name,
        };
        // Nothing to apply on a copy of the template; a check all the same.
        if let Err(e) = flotilla_store::MIGRATOR.run(&scratch.pool).await {
            scratch.drop_database().await;
            return Err(RehearsalError::Database(format!("migrating: {e}")));
        }
        Ok(scratch)
    }

    /// Closes the pool and drops the database; a failure is only said, as
    /// the rehearsal's answer stands.
    pub(crate) async fn drop_database(&self) {
        self.pool.close().await;
        let dropped = async {
            let mut connection = PgConnection::connect_with(&self.admin).await?;
            sqlx::raw_sql(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&mut connection)
            .await?;
            connection.close().await
        };
        if let Err(e) = dropped.await {
            eprintln!("could not drop the scratch database {}: {e}", self.name);
        }
    }
}

/// The migrated template of this release's schema, built when the server
/// has none; templates of other schema versions are dropped then. Called
/// under [`TEMPLATE_LOCK`].
async fn template(
    admin: &PgConnectOptions,
    connection: &mut PgConnection,
) -> Result<String, RehearsalError> {
    let version = flotilla_store::MIGRATOR
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
    let template = format!("flotilla_rehearsal_template_{version}");
    let exists: bool =
        sqlx::query_scalar("SELECT exists (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&template)
            .fetch_one(&mut *connection)
            .await
            .map_err(RehearsalError::database)?;
    if exists {
        return Ok(template);
    }
    let stale: Vec<String> = sqlx::query_scalar(
        "SELECT datname FROM pg_database WHERE datname LIKE 'flotilla\\_rehearsal\\_template\\_%'",
    )
    .fetch_all(&mut *connection)
    .await
    .map_err(RehearsalError::database)?;
    for old in stale {
        let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {old} WITH (FORCE)"))
            .execute(&mut *connection)
            .await;
    }
    // Built under another name and renamed once whole: a build cut short
    // never passes for the template.
    let building = format!(
        "flotilla_rehearsal_building_{}",
        uuid::Uuid::new_v4().simple()
    );
    sqlx::raw_sql(&format!("CREATE DATABASE {building}"))
        .execute(&mut *connection)
        .await
        .map_err(creating_refused)?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(admin.clone().database(&building));
    let migrated = flotilla_store::MIGRATOR.run(&pool).await;
    pool.close().await;
    // A database with a session in it cannot be renamed: the migration's
    // closed connection leaves on its server's own time, and an autovacuum
    // worker may have come in after the migration's writes. Nothing else
    // uses the database yet, so its sessions are ended until none is left.
    let gone = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        // A role that may not end an autovacuum worker waits for it instead.
        let _ = sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(&building)
        .execute(&mut *connection)
        .await;
        let sessions: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
                .bind(&building)
                .fetch_one(&mut *connection)
                .await
                .map_err(RehearsalError::database)?;
        if sessions == 0 || std::time::Instant::now() >= gone {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let renamed = match migrated {
        Ok(()) => sqlx::raw_sql(&format!("ALTER DATABASE {building} RENAME TO {template}"))
            .execute(&mut *connection)
            .await
            .map(|_| ())
            .map_err(|e| format!("naming the template: {e}")),
        Err(e) => Err(format!("migrating: {e}")),
    };
    if let Err(e) = renamed {
        let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"))
            .execute(&mut *connection)
            .await;
        return Err(RehearsalError::Database(e));
    }
    Ok(template)
}

/// A `CREATE DATABASE` refused, with what the URL's role needs.
fn creating_refused(e: sqlx::Error) -> RehearsalError {
    RehearsalError::Database(format!(
        "creating a scratch database (the URL's role needs CREATEDB): {e}"
    ))
}
