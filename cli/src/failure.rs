//! How the CLI fails: an error and the exit code scripts can rely on.

/// An error with the exit code scripts can rely on.
#[derive(Debug)]
pub struct Failure {
    pub error: anyhow::Error,
    pub exit_code: u8,
}

impl Failure {
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Self {
            error: error.into(),
            exit_code: 2,
        }
    }

    pub fn delivery(error: impl Into<anyhow::Error>) -> Self {
        Self {
            error: error.into(),
            exit_code: 1,
        }
    }

    /// The outcome differs from the one expected (exit code 1).
    pub fn mismatch(error: impl Into<anyhow::Error>) -> Self {
        Self {
            error: error.into(),
            exit_code: 1,
        }
    }

    /// What was asked for does not exist (exit code 3).
    pub fn not_found(error: impl Into<anyhow::Error>) -> Self {
        Self {
            error: error.into(),
            exit_code: 3,
        }
    }
}
