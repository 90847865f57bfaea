//! The one mapping from engine errors to problem responses. A database that
//! does not answer is 503 with the reason; a row that breaks an invariant is
//! 500; everything about the request itself is a 4xx naming the problem.

use axum::http::StatusCode;
use flotilla_engine::rows::StoreError;
use serde_json::json;

use crate::problem::Problem;
use flotilla_engine::{
    CompleteError, GraftError, ListError, OperatorError, RegisterError, SubmitError,
};

impl From<StoreError> for Problem {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Database(e) => Self::unavailable(&e),
            StoreError::Shared(e) => Self::unavailable(&e),
            StoreError::OutcomeUnknown(e) => Self::unavailable(&e),
            StoreError::RowHeld => Self::unavailable(&"the row is locked by another session"),
            other => Self::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
    }
}

impl From<SubmitError> for Problem {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Conflict(_) => Self::new(StatusCode::CONFLICT, e.to_string()),
            SubmitError::UnknownWorkflow(_) | SubmitError::UnknownVersion { .. } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
            }
            SubmitError::InvalidDefinition(invalid) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, invalid.to_string())
                    .with(json!({ "problems": invalid.problems }))
            }
            SubmitError::InvalidInput { ref violations, .. } => {
                let extra = json!({ "violations": violations });
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()).with(extra)
            }
            SubmitError::Unstorable(ref unstorable) => {
                let extra = json!({ "field": unstorable.field });
                Self::bad_request(e.to_string()).with(extra)
            }
            SubmitError::Store(e) => e.into(),
        }
    }
}

impl From<CompleteError> for Problem {
    fn from(e: CompleteError) -> Self {
        match e {
            CompleteError::NotFound(_) => Self::not_found(e.to_string()),
            CompleteError::TooNew { .. } => Self::new(StatusCode::CONFLICT, e.to_string()),
            CompleteError::Unstorable(ref unstorable) => {
                let extra = json!({ "field": unstorable.field });
                Self::bad_request(e.to_string()).with(extra)
            }
            CompleteError::Store(e) => e.into(),
        }
    }
}

impl From<OperatorError> for Problem {
    fn from(e: OperatorError) -> Self {
        match e {
            OperatorError::NotFound(_) => Self::not_found(e.to_string()),
            OperatorError::WrongState { .. } => Self::new(StatusCode::CONFLICT, e.to_string()),
            OperatorError::NoSuchVersion(_) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
            }
            OperatorError::Unstorable(ref unstorable) => {
                let extra = json!({ "field": unstorable.field });
                Self::bad_request(e.to_string()).with(extra)
            }
            OperatorError::Store(e) => e.into(),
        }
    }
}

impl From<ListError> for Problem {
    fn from(e: ListError) -> Self {
        match e {
            ListError::NegativeLimit(_) | ListError::BadCursor(_) => {
                Self::bad_request(e.to_string())
            }
            ListError::Unstorable(ref unstorable) => {
                let extra = json!({ "field": unstorable.field });
                Self::bad_request(e.to_string()).with(extra)
            }
            ListError::Store(e) => e.into(),
        }
    }
}

impl From<RegisterError> for Problem {
    fn from(e: RegisterError) -> Self {
        match e {
            RegisterError::Invalid(invalid) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, invalid.to_string())
                    .with(json!({ "problems": invalid.problems }))
            }
            RegisterError::Database(e) => Self::unavailable(&e),
            RegisterError::TooManyVersions(why) => Self::new(StatusCode::CONFLICT, why),
            RegisterError::Unstorable(ref unstorable) => {
                let extra = json!({ "field": unstorable.field });
                Self::bad_request(e.to_string()).with(extra)
            }
            other @ (RegisterError::NameMismatch { .. } | RegisterError::File { .. }) => {
                Self::bad_request(other.to_string())
            }
        }
    }
}

impl From<GraftError> for Problem {
    fn from(e: GraftError) -> Self {
        match e {
            GraftError::NotFound(_) => Self::not_found(e.to_string()),
            GraftError::Finished { status, .. } => Self::new(StatusCode::CONFLICT, e.to_string())
                .with(json!({ "job_status": status.as_str() })),
            GraftError::Stale { current, .. } => {
                Self::new(StatusCode::CONFLICT, e.to_string()).with(json!({ "revision": current }))
            }
            GraftError::TooNew { .. } => Self::new(StatusCode::CONFLICT, e.to_string()),
            GraftError::Malformed(_) => Self::bad_request(e.to_string()),
            GraftError::Invalid(invalid) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, invalid.to_string())
                    .with(json!({ "problems": invalid.problems }))
            }
            GraftError::Unstorable(ref unstorable) => {
                let extra = json!({ "field": unstorable.field });
                Self::bad_request(e.to_string()).with(extra)
            }
            GraftError::Store(e) => e.into(),
        }
    }
}
