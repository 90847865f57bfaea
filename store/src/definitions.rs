//! `workflow_definition`: stored workflows, versioned by name.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgTransaction};

/// A stored version of a workflow.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct StoredDefinition {
    pub name: String,
    pub version: i32,
    pub definition: Json<serde_json::Value>,
    pub created_at: DateTime<Utc>,
}

/// What registering a document did.
#[derive(Debug, Clone)]
pub struct Registered {
    pub definition: StoredDefinition,
    /// `true`: a new version was stored; `false`: the document equals the
    /// newest version, which is returned unchanged.
    pub created: bool,
}

/// Stores `document` as the next version of `name`, unless it equals the
/// newest version already (then that one is returned): registering the same
/// files at every start-up does not pile up versions. Concurrent
/// registrations of one name are serialised, so `created` is exact.
///
/// # Errors
/// Database errors.
pub async fn register(
    tx: &mut PgTransaction<'_>,
    name: &str,
    document: &serde_json::Value,
) -> Result<Registered, sqlx::Error> {
    // Serialise concurrent registrations of one name (two workers starting at once).
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('workflow_definition:' || $1))")
        .bind(name)
        .execute(&mut **tx)
        .await?;
    if let Some(newest) = newest(tx, name).await?
        && newest.definition.0 == *document
    {
        return Ok(Registered {
            definition: newest,
            created: false,
        });
    }
    let definition = sqlx::query_as(
        "INSERT INTO workflow_definition (name, version, definition)
         SELECT $1, coalesce(max(version), 0) + 1, $2 FROM workflow_definition WHERE name = $1
         RETURNING name, version, definition, created_at",
    )
    .bind(name)
    .bind(Json(document))
    .fetch_one(&mut **tx)
    .await?;
    Ok(Registered {
        definition,
        created: true,
    })
}

/// The newest version of `name`.
///
/// # Errors
/// Database errors.
pub async fn newest(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Option<StoredDefinition>, sqlx::Error> {
    sqlx::query_as(
        "SELECT name, version, definition, created_at FROM workflow_definition
         WHERE name = $1 ORDER BY version DESC LIMIT 1",
    )
    .bind(name)
    .fetch_optional(conn)
    .await
}

/// The newest version of every workflow, by name.
///
/// # Errors
/// Database errors.
pub async fn list_newest(conn: &mut PgConnection) -> Result<Vec<StoredDefinition>, sqlx::Error> {
    sqlx::query_as(
        "SELECT DISTINCT ON (name) name, version, definition, created_at FROM workflow_definition
         ORDER BY name, version DESC",
    )
    .fetch_all(conn)
    .await
}

/// Every version of `name`, newest first (empty when there is none).
///
/// # Errors
/// Database errors.
pub async fn versions(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Vec<StoredDefinition>, sqlx::Error> {
    sqlx::query_as(
        "SELECT name, version, definition, created_at FROM workflow_definition
         WHERE name = $1 ORDER BY version DESC",
    )
    .bind(name)
    .fetch_all(conn)
    .await
}
