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

/// Which stored version a document equal to it is taken as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reregister {
    /// Only the newest: a document equal to an older version becomes the
    /// newest as a new version (an operator putting back what was, on
    /// purpose: the API's PUT).
    Newest,
    /// Any version: a document the name ever held stores nothing (a worker
    /// started with an older workflows directory during a rolling deploy
    /// never makes the older document newest again).
    AnyVersion,
}

/// Why a registration stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum RegisterRefused {
    /// `name` holds `limit` versions already.
    #[error(
        "workflow {name:?} has {limit} versions, the most one name may hold: register it under a new name"
    )]
    TooManyVersions { name: String, limit: i32 },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Stores `document` as the next version of `name`, unless it equals the
/// newest version already, or with [`Reregister::AnyVersion`] any version
/// (then that one is returned): registering the same files at every
/// start-up does not pile up versions. Concurrent
/// registrations of one name are serialised, so `created` is exact. A name
/// holds at most `max_versions` versions.
///
/// # Errors
/// Too many versions; database errors.
pub async fn register(
    tx: &mut PgTransaction<'_>,
    name: &str,
    document: &serde_json::Value,
    max_versions: i32,
    reregister: Reregister,
) -> Result<Registered, RegisterRefused> {
    // Serialise concurrent registrations of one name (two workers starting at once).
    crate::sql::query("SELECT pg_advisory_xact_lock(hashtext('workflow_definition:' || $1))")
        .bind(name)
        .execute(&mut **tx)
        .await?;
    let newest = newest(tx, name).await?;
    if let Some(newest) = newest.as_ref()
        && newest.definition.0 == *document
    {
        return Ok(Registered {
            definition: newest.clone(),
            created: false,
        });
    }
    if reregister == Reregister::AnyVersion {
        // jsonb equality: the same document, whatever its key order.
        let held: Option<StoredDefinition> = crate::sql::query_as(
            "SELECT name, version, definition, created_at FROM workflow_definition
             WHERE name = $1 AND definition = $2 ORDER BY version DESC LIMIT 1",
        )
        .bind(name)
        .bind(Json(document))
        .fetch_optional(&mut **tx)
        .await?;
        if let Some(definition) = held {
            return Ok(Registered {
                definition,
                created: false,
            });
        }
    }
    // Versions are never deleted (jobs point at them): the count is the
    // newest version number.
    if let Some(newest) = newest
        && newest.version >= max_versions
    {
        return Err(RegisterRefused::TooManyVersions {
            name: name.to_owned(),
            limit: max_versions,
        });
    }
    let definition = crate::sql::query_as(
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

/// Version `version` of `name`.
///
/// # Errors
/// Database errors.
pub async fn version(
    conn: &mut PgConnection,
    name: &str,
    version: i32,
) -> Result<Option<StoredDefinition>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT name, version, definition, created_at FROM workflow_definition
         WHERE name = $1 AND version = $2",
    )
    .bind(name)
    .bind(version)
    .fetch_optional(conn)
    .await
}

/// The newest version of `name`.
///
/// # Errors
/// Database errors.
pub async fn newest(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Option<StoredDefinition>, sqlx::Error> {
    crate::sql::query_as(
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
    crate::sql::query_as(
        "SELECT DISTINCT ON (name) name, version, definition, created_at FROM workflow_definition
         ORDER BY name, version DESC",
    )
    .fetch_all(conn)
    .await
}

/// Up to `limit` versions of `name` older than `before` (all when `None`),
/// newest first (empty when there is none).
///
/// # Errors
/// Database errors.
pub async fn versions(
    conn: &mut PgConnection,
    name: &str,
    before: Option<i32>,
    limit: i64,
) -> Result<Vec<StoredDefinition>, sqlx::Error> {
    crate::sql::query_as(
        "SELECT name, version, definition, created_at FROM workflow_definition
         WHERE name = $1 AND version < coalesce($2, 2147483647)
         ORDER BY version DESC LIMIT $3",
    )
    .bind(name)
    .bind(before)
    .bind(limit)
    .fetch_all(conn)
    .await
}
