//! [`SubmitError`]: why a submission did not happen, classed once.

/// Why a submission did not happen. Each error is about one thing:
/// the request itself, the world, or this client's settings.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The request can never be accepted as it is (a rule it breaks, a
    /// 4xx from the API, a record too large): fix it, do not retry it.
    #[error("the request was refused: {0}")]
    Rejected(String),
    /// The broker, the registry or the API could not take it now: the same
    /// request (with the same job id) may be retried; a repeat is harmless.
    #[error("the fleet could not be reached: {0}")]
    Unavailable(String),
    /// This client's settings cannot work (the API refused the token, a
    /// schema the registry refuses, a bad CA file or URL, a producer
    /// librdkafka declared fatal). A registry refusing credentials is
    /// [`SubmitError::Unavailable`], as it is for the fleet (credentials
    /// rotated in come back); so are Kafka credentials the broker refuses,
    /// which librdkafka reports only when the record's delivery times out
    /// (`message.timeout.ms`, 300 s by default).
    #[error("client settings: {0}")]
    Settings(String),
}

impl SubmitError {
    /// Whether sending the same request again later can succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

#[cfg(feature = "kafka")]
impl From<flotilla_codec::CodecError> for SubmitError {
    fn from(error: flotilla_codec::CodecError) -> Self {
        use flotilla_codec::CodecError;
        match error {
            CodecError::Decode(_) | CodecError::Rule(_) => Self::Rejected(error.to_string()),
            CodecError::RegistryUnavailable(_) => Self::Unavailable(error.to_string()),
            CodecError::RegistryRefused { .. }
            | CodecError::Settings(_)
            | CodecError::NoRegistry(_) => Self::Settings(error.to_string()),
        }
    }
}
