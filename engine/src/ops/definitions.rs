//! Registering stored workflows: validated against this worker's targets
//! before they are written, and loaded from a directory at start-up.

use std::path::Path;

use flotilla_store::definitions::{
    self, RegisterRefused, Registered, Reregister, StoredDefinition,
};

use crate::Engine;
use crate::support::storable::{self, Unstorable};
use flotilla_workflow::InvalidDefinition;

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error(transparent)]
    Invalid(#[from] InvalidDefinition),
    /// A value the store cannot hold (a NUL, a name over the limit).
    #[error(transparent)]
    Unstorable(#[from] Unstorable),
    #[error("the definition is named {found:?}, not {expected:?}")]
    NameMismatch { expected: String, found: String },
    #[error("reading {path}: {reason}")]
    File { path: String, reason: String },
    /// The name holds the most versions a name may.
    #[error("{0}")]
    TooManyVersions(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// Versions one workflow name may hold: versions are never deleted (jobs
/// point at them), so a client registering in a loop stops here.
pub(crate) const MAX_VERSIONS_PER_NAME: i32 = 1000;

impl From<RegisterRefused> for RegisterError {
    fn from(refused: RegisterRefused) -> Self {
        match refused {
            RegisterRefused::Database(e) => Self::Database(e),
            too_many @ RegisterRefused::TooManyVersions { .. } => {
                Self::TooManyVersions(too_many.to_string())
            }
        }
    }
}

impl Engine {
    /// Validates `document` and stores it as the newest version of its name
    /// (unless it equals the newest version already: then `created` is false).
    ///
    /// # Errors
    /// Every problem of an invalid definition; database errors.
    pub async fn register_workflow(
        &self,
        document: &serde_json::Value,
    ) -> Result<Registered, RegisterError> {
        self.register(document, Reregister::Newest).await
    }

    async fn register(
        &self,
        document: &serde_json::Value,
        reregister: Reregister,
    ) -> Result<Registered, RegisterError> {
        storable::check_json("workflow", document)?;
        let compiled = self.compile(document).await?;
        storable::check_workflow_name(&compiled.definition.name)?;
        let mut tx = self.pool().begin().await?;
        let registered = definitions::register(
            &mut tx,
            &compiled.definition.name,
            document,
            MAX_VERSIONS_PER_NAME,
            reregister,
        )
        .await?;
        tx.commit().await?;
        Ok(registered)
    }

    /// Registers every `.json`, `.yaml` and `.yml` file of `dir`, in name
    /// order. A file equal to any version its name held stores nothing and
    /// is that version, so a worker started with an older directory during
    /// a rolling deploy never makes the older document newest again.
    ///
    /// # Errors
    /// The first file that cannot be read, parsed or registered, named.
    pub async fn register_workflows_dir(
        &self,
        dir: &Path,
    ) -> Result<Vec<StoredDefinition>, RegisterError> {
        let file_error = |path: &Path, reason: String| RegisterError::File {
            path: path.display().to_string(),
            reason,
        };
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| file_error(dir, e.to_string()))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| {
                matches!(
                    path.extension().and_then(|e| e.to_str()),
                    Some("json" | "yaml" | "yml")
                )
            })
            .collect();
        paths.sort();
        let mut stored = Vec::with_capacity(paths.len());
        for path in paths {
            let text =
                std::fs::read_to_string(&path).map_err(|e| file_error(&path, e.to_string()))?;
            let document = flotilla_workflow::read_document(&text)
                .map_err(|reason| file_error(&path, reason))?;
            let definition = self
                .register(&document, Reregister::AnyVersion)
                .await
                .map_err(|e| file_error(&path, e.to_string()))?
                .definition;
            tracing::info!(name = %definition.name, version = definition.version, path = %path.display(), "workflow registered");
            stored.push(definition);
        }
        Ok(stored)
    }
}
