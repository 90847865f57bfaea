//! A target's rate limit, `<calls>/<period>` (`100/s`, `1000/m`, `50/h`):
//! at most `calls` calls begin in any window of `period`, fleet-wide. The
//! engine asks the store for a permit before each call
//! (`store/src/target_rates.rs`); this is the setting.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// At most `calls` calls to a target begin within any `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub calls: u32,
    pub period: Duration,
}

/// The most calls a rate limit may allow per period (10 µs apart at most
/// per second).
pub const MAX_RATE_CALLS: u32 = 100_000;

impl FromStr for RateLimit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let shape = || format!("{text:?} is not <calls>/<s|m|h>, as in 100/s or 1000/m");
        let (calls, unit) = text.trim().split_once('/').ok_or_else(shape)?;
        let calls: u32 = calls.trim().parse().map_err(|_| shape())?;
        let period = match unit.trim() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(shape()),
        };
        if !(1..=MAX_RATE_CALLS).contains(&calls) {
            return Err(format!(
                "{text:?}: the calls per period must be 1 to {MAX_RATE_CALLS}"
            ));
        }
        Ok(Self { calls, period })
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.period.as_secs() {
            1 => "s",
            60 => "m",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_reads_calls_per_second_minute_or_hour_and_refuses_the_rest() {
        assert_eq!(
            "100/s".parse(),
            Ok(RateLimit {
                calls: 100,
                period: Duration::from_secs(1)
            })
        );
        let per_minute: RateLimit = " 1000 / m ".parse().unwrap();
        assert_eq!((per_minute.calls, per_minute.period.as_secs()), (1000, 60));
        assert_eq!(per_minute.to_string(), "1000/m");
        assert_eq!("5/h".parse::<RateLimit>().unwrap().period.as_secs(), 3600);
        for bad in [
            "100", "100/d", "x/s", "-1/s", "0/s", "100001/s", "/s", "100/",
        ] {
            assert!(bad.parse::<RateLimit>().is_err(), "{bad}");
        }
    }
}
