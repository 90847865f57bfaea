//! `fleet_feature`: the one-way switches turned on for the whole database.
//! A switch writes runs that workers of earlier releases cannot read, so it
//! is turned on only when no such worker is alive (see [`older_workers`]),
//! and once on, it stays on.

use sqlx::PgConnection;

/// A one-way switch of the run layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// Checkpoints as rows of `workflow_run_checkpoint`.
    CheckpointRows,
    /// Jobs of stored workflows point at their version, no copy.
    DefinitionByReference,
}

impl Feature {
    pub const ALL: [Self; 2] = [Self::CheckpointRows, Self::DefinitionByReference];

    /// Its name in `fleet_feature`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::CheckpointRows => "checkpoint_rows",
            Self::DefinitionByReference => "definition_by_reference",
        }
    }

    /// The reader level its runs need.
    #[must_use]
    pub fn reader_level(self) -> i16 {
        1
    }
}

/// The switches turned on in this database.
///
/// # Errors
/// Database errors.
pub async fn enabled(conn: &mut PgConnection) -> Result<Vec<Feature>, sqlx::Error> {
    let names: Vec<String> = crate::sql::query_scalar("SELECT name FROM fleet_feature")
        .fetch_all(conn)
        .await?;
    Ok(Feature::ALL
        .into_iter()
        .filter(|feature| names.iter().any(|name| name == feature.name()))
        .collect())
}

/// Workers other than `worker_id` that may be alive and cannot read runs of
/// `level`: members seen within `ttl_ms` that announce a lower level (a
/// release before levels announces none: 0), and lease holders with no
/// fresh member row at all (a release before members).
///
/// # Errors
/// Database errors.
pub async fn older_workers(
    conn: &mut PgConnection,
    worker_id: &str,
    level: i16,
    ttl_ms: i64,
) -> Result<Vec<String>, sqlx::Error> {
    crate::sql::query_scalar(
        "WITH fresh AS (SELECT worker_id, reader_level FROM worker_member
                        WHERE last_seen > now() - $3 * interval '1 millisecond')
         SELECT worker_id FROM fresh WHERE reader_level < $2 AND worker_id <> $1
         UNION
         SELECT DISTINCT lease_owner FROM workflow_run
         WHERE status = 'RUNNING' AND lease_owner IS NOT NULL AND lease_owner <> $1
           AND lease_owner NOT IN (SELECT worker_id FROM fresh)
         ORDER BY 1",
    )
    .bind(worker_id)
    .bind(i32::from(level))
    .bind(ttl_ms)
    .fetch_all(conn)
    .await
}

/// Turns `feature` on for the database (a no-op if it is on already).
///
/// # Errors
/// Database errors.
pub async fn enable(
    conn: &mut PgConnection,
    feature: Feature,
    by: &str,
) -> Result<(), sqlx::Error> {
    crate::sql::query(
        "INSERT INTO fleet_feature (name, reader_level, enabled_by) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(feature.name())
    .bind(i32::from(feature.reader_level()))
    .bind(by)
    .execute(conn)
    .await?;
    Ok(())
}
