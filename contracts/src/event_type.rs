//! The kinds of lifecycle event.

use serde::{Deserialize, Serialize};

/// What happened. `Unspecified` exists for schema evolution (it is the Avro
/// enum's default) and is never published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkflowRunEventType {
    Unspecified,
    Accepted,
    StepCheckpoint,
    Waiting,
    Completed,
    Failed,
    Dead,
    Cancelled,
}

impl WorkflowRunEventType {
    /// Every type, in the order of the Avro enum's symbols.
    pub const ALL: [Self; 8] = [
        Self::Unspecified,
        Self::Accepted,
        Self::StepCheckpoint,
        Self::Waiting,
        Self::Completed,
        Self::Failed,
        Self::Dead,
        Self::Cancelled,
    ];

    /// The wire name, e.g. `STEP_CHECKPOINT`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "UNSPECIFIED",
            Self::Accepted => "ACCEPTED",
            Self::StepCheckpoint => "STEP_CHECKPOINT",
            Self::Waiting => "WAITING",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Dead => "DEAD",
            Self::Cancelled => "CANCELLED",
        }
    }

    /// Parses a wire name.
    #[must_use]
    pub fn from_wire(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// Whether the job is finished for good (until an operator acts).
    #[must_use]
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Dead | Self::Cancelled
        )
    }
}

impl std::fmt::Display for WorkflowRunEventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
