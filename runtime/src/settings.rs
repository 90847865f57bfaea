//! Value parsers for settings that refuse what would panic or make no
//! sense (a zero interval, a lease of a thousand years) at start-up, with
//! clap's message naming the flag.

use std::time::Duration;

/// A parser for a duration (`30s`, `5m`) between `min` and `max` inclusive.
pub fn duration_between(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<humantime::Duration, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let parsed = humantime::parse_duration(text).map_err(|e| e.to_string())?;
        if parsed < min || parsed > max {
            return Err(format!(
                "{} is out of range: it must be between {} and {}",
                humantime::format_duration(parsed),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ));
        }
        Ok(parsed.into())
    }
}

/// The bounds most intervals share: a millisecond to a day.
pub const MILLISECOND: Duration = Duration::from_millis(1);
pub const SECOND: Duration = Duration::from_secs(1);
pub const HOUR: Duration = Duration::from_secs(3600);
pub const DAY: Duration = Duration::from_secs(24 * 3600);
pub const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// A secret value: kept out of `Debug` output from the moment it is parsed.
///
/// # Errors
/// Never; the signature is clap's.
pub fn secret(value: &str) -> Result<secrecy::SecretString, std::convert::Infallible> {
    Ok(secrecy::SecretString::from(value))
}

/// A secret read from a file (a mounted secret); a trailing newline is not
/// part of it. Read while the settings are parsed, so a missing file stops
/// start-up with clap's message naming the setting.
///
/// # Errors
/// The file cannot be read.
pub fn secret_from_file(path: &str) -> Result<secrecy::SecretString, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(secrecy::SecretString::from(
        text.trim_end_matches(['\r', '\n']),
    ))
}

/// A path to a file this process can open.
///
/// # Errors
/// The file cannot be opened.
pub fn readable_file(path: &str) -> Result<std::path::PathBuf, String> {
    std::fs::File::open(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(std::path::PathBuf::from(path))
}

/// A setting that cannot work, named as the user wrote it.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {problem}")]
pub struct SecurityError {
    pub setting: &'static str,
    pub problem: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_outside_their_bounds_are_refused_by_value() {
        let lease = duration_between(SECOND, DAY);
        assert_eq!(*lease("20s").unwrap(), Duration::from_secs(20));
        assert!(lease("0s").unwrap_err().contains("out of range"));
        assert!(lease("1000years").unwrap_err().contains("out of range"));
        assert!(lease("soon").is_err());
    }
}
