//! The status columns as Rust enums. They are stored as text (the schema's
//! CHECK constraints list the same words); an unknown word read back is an
//! error, never a silent fallback.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::{Decode, Encode, Postgres, Type};

/// A status word that is not one of the enum's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} status {word:?}")]
pub struct UnknownStatus {
    kind: &'static str,
    word: String,
}

/// Declares a status enum stored as its SCREAMING_SNAKE_CASE word.
macro_rules! text_status {
    ($(#[$meta:meta])* $name:ident, $kind:literal, { $($variant:ident => $word:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
        pub enum $name {
            $($variant,)+
        }

        impl $name {
            /// Every status, in the order of the state machine.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)+];

            /// The word stored in the column.
            #[must_use]
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $word,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownStatus;
            fn from_str(word: &str) -> Result<Self, Self::Err> {
                match word {
                    $($word => Ok(Self::$variant),)+
                    _ => Err(UnknownStatus { kind: $kind, word: word.to_owned() }),
                }
            }
        }

        impl Type<Postgres> for $name {
            fn type_info() -> PgTypeInfo {
                <&str as Type<Postgres>>::type_info()
            }
            fn compatible(ty: &PgTypeInfo) -> bool {
                <&str as Type<Postgres>>::compatible(ty)
            }
        }

        impl Encode<'_, Postgres> for $name {
            fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                <&str as Encode<'_, Postgres>>::encode(self.as_str(), buf)
            }
        }

        impl Decode<'_, Postgres> for $name {
            fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
                Ok(<&str as Decode<'_, Postgres>>::decode(value)?.parse()?)
            }
        }
    };
}

text_status!(
    /// The states of a run (`workflow_run.status`).
    RunStatus, "run", {
        Queued => "QUEUED",
        Running => "RUNNING",
        Waiting => "WAITING",
        Completed => "COMPLETED",
        Failed => "FAILED",
        Dead => "DEAD",
        Cancelled => "CANCELLED",
    }
);

impl RunStatus {
    /// Whether the run is finished (until an operator retries it).
    #[must_use]
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Dead | Self::Cancelled
        )
    }
}

text_status!(
    /// The publication states of an outbox row (`workflow_run_outbox_state.status`).
    OutboxStatus, "outbox", {
        Pending => "PENDING",
        Published => "PUBLISHED",
        Failed => "FAILED",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_reads_back_from_its_word_and_unknown_words_are_refused() {
        for status in RunStatus::ALL {
            assert_eq!(status.as_str().parse::<RunStatus>(), Ok(*status));
        }
        for status in OutboxStatus::ALL {
            assert_eq!(status.as_str().parse::<OutboxStatus>(), Ok(*status));
        }
        let refused = "PAUSED".parse::<RunStatus>().unwrap_err();
        assert_eq!(refused.to_string(), "unknown run status \"PAUSED\"");
    }
}
