//! The Postgres pool, its settings, and the embedded migrations (from `migrations/`).

use std::time::Duration;

use clap::Args;
use secrecy::{ExposeSecret as _, SecretString};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};

/// Every migration of `migrations/`, embedded at build time.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Connections one process keeps open, unless configured.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;
/// How long a caller waits for a pooled connection, unless configured.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the database is and how many connections to keep.
#[derive(Debug, Clone, Args)]
pub struct DatabaseConfig {
    /// Postgres connection string (a secret: never printed).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_parser = parse_secret)]
    pub database_url: SecretString,

    /// Most connections this process keeps open.
    #[arg(long, env = "FLOTILLA_DB_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..=10_000))]
    pub db_max_connections: u32,

    /// How long to wait for a connection from the pool.
    #[arg(long, env = "FLOTILLA_DB_ACQUIRE_TIMEOUT", default_value_t = DEFAULT_ACQUIRE_TIMEOUT.into(), value_parser = parse_acquire_timeout)]
    pub db_acquire_timeout: humantime::Duration,

    /// What `DATABASE_URL` reaches: `none` (Postgres itself, or a pooler in
    /// session mode) or `transaction` (a pooler in transaction mode, such
    /// as PgBouncer's `pool_mode = transaction`: statements are prepared
    /// for one execution inside their transaction, no session state is
    /// kept, and `LISTEN` needs `--db-listen-url`).
    #[arg(long, env = "FLOTILLA_DB_POOLER", value_enum, default_value_t = Pooler::None)]
    pub db_pooler: Pooler,

    /// Where the wake-ups' `LISTEN` connection goes, when not to
    /// `DATABASE_URL`: Postgres itself (or a session-mode pooler), since a
    /// transaction-mode pooler cannot carry a `LISTEN`. Behind one without
    /// this, nothing listens and work is found at the next poll (a secret:
    /// never printed).
    #[arg(long, env = "FLOTILLA_DB_LISTEN_URL", hide_env_values = true, value_parser = parse_secret)]
    pub db_listen_url: Option<SecretString>,
}

/// Where `LISTEN` connects, when set apart from the pool (`--db-listen-url`).
static LISTEN_OPTIONS: std::sync::OnceLock<PgConnectOptions> = std::sync::OnceLock::new();

/// The connection settings for `LISTEN` given apart from the pool's.
#[must_use]
pub fn listen_options() -> Option<&'static PgConnectOptions> {
    LISTEN_OPTIONS.get()
}

/// What sits between this process and Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Pooler {
    /// Postgres itself, or a pooler that gives a client one server
    /// connection for its whole session.
    #[default]
    None,
    /// A pooler that gives a client a server connection for one
    /// transaction at a time.
    Transaction,
}

impl DatabaseConfig {
    /// Settings for `url` with the default pool size and timeout.
    #[must_use]
    pub fn new(url: &str) -> Self {
        Self {
            database_url: SecretString::from(url),
            db_max_connections: DEFAULT_MAX_CONNECTIONS,
            db_acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT.into(),
            db_pooler: Pooler::None,
            db_listen_url: None,
        }
    }
}

/// clap's parser for secret values: kept out of `Debug` output from the start.
///
/// # Errors
/// Never; the signature is clap's.
pub fn parse_secret(value: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(value))
}

/// A wait for a pooled connection: more than nothing, at most an hour.
fn parse_acquire_timeout(text: &str) -> Result<humantime::Duration, String> {
    let parsed = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if parsed.is_zero() || parsed > Duration::from_secs(3600) {
        return Err(format!(
            "{} is out of range: it must be above 0s and at most 1h",
            humantime::format_duration(parsed)
        ));
    }
    Ok(parsed.into())
}

/// Opens a pool and checks that the database answers. The TLS files named
/// by the URL or the `PGSSL*` variables are checked first (see
/// [`check_tls_files`]).
///
/// # Errors
/// A TLS file cannot be read, the URL is malformed, or the database does
/// not answer in time.
pub async fn connect(config: &DatabaseConfig) -> Result<PgPool, sqlx::Error> {
    use std::str::FromStr as _;
    check_tls_files(config.database_url.expose_secret())?;
    let mut options = PgConnectOptions::from_str(config.database_url.expose_secret())?;
    if let Some(url) = &config.db_listen_url {
        check_tls_files(url.expose_secret())?;
        // The first pool opened sets it: one database path per process.
        let _ = LISTEN_OPTIONS.set(PgConnectOptions::from_str(url.expose_secret())?);
    }
    if config.db_pooler == Pooler::Transaction {
        // A statement kept prepared would outlive the transaction that
        // holds its server connection; PgBouncer refuses startup
        // parameters it does not know, as `extra_float_digits` (text
        // floats only: every statement here is read in binary).
        options = options.statement_cache_capacity(0).extra_float_digits(None);
        crate::sql::prepare_for_one_execution();
    }
    PgPoolOptions::new()
        .max_connections(config.db_max_connections)
        .acquire_timeout(*config.db_acquire_timeout)
        .connect_with(options)
        .await
}

/// The TLS files a connection reads: the setting in the URL (with the
/// spellings sqlx also accepts) and its standard variable.
const TLS_FILES: [(&str, &[&str], &str); 3] = [
    (
        "sslrootcert",
        &["sslrootcert", "ssl-root-cert", "ssl-ca"],
        "PGSSLROOTCERT",
    ),
    ("sslcert", &["sslcert", "ssl-cert"], "PGSSLCERT"),
    ("sslkey", &["sslkey", "ssl-key"], "PGSSLKEY"),
];

/// Refuses a TLS file (`sslrootcert`, `sslcert`, `sslkey`, from the URL or
/// `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`; the URL wins, as in sqlx) that
/// cannot be read, naming the setting and the path: sqlx reads them only
/// during the handshake and then says no more than "No such file or
/// directory". Skipped when TLS is off (`sslmode` `disable` or `allow`); a
/// variable holding the PEM text itself is not a path.
///
/// # Errors
/// The first file that cannot be read, as a configuration error.
pub fn check_tls_files(url: &str) -> Result<(), sqlx::Error> {
    use std::str::FromStr as _;
    // A URL sqlx cannot parse is left to sqlx to report.
    let Ok(options) = PgConnectOptions::from_str(url) else {
        return Ok(());
    };
    if matches!(
        options.get_ssl_mode(),
        PgSslMode::Disable | PgSslMode::Allow
    ) {
        return Ok(());
    }
    let query = query_pairs(url);
    for (setting, keys, variable) in TLS_FILES {
        let in_url = query
            .iter()
            .rev()
            .find(|(key, _)| keys.contains(&key.as_str()))
            .map(|(_, value)| (format!("{setting} in DATABASE_URL"), value.clone()));
        let named = in_url.or_else(|| {
            let value = std::env::var(variable).ok()?;
            let pem = value.trim_start().starts_with("-----BEGIN");
            (!pem).then(|| (variable.to_owned(), value))
        });
        if let Some((source, path)) = named
            && let Err(e) = std::fs::File::open(&path)
        {
            return Err(sqlx::Error::Configuration(
                format!("{source}: cannot read {path}: {e}").into(),
            ));
        }
    }
    Ok(())
}

/// The decoded `key=value` pairs of a URL's query, in order.
fn query_pairs(url: &str) -> Vec<(String, String)> {
    let Some((_, query)) = url.split_once('?') else {
        return Vec::new();
    };
    let query = query.split_once('#').map_or(query, |(query, _)| query);
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

/// Form decoding, as sqlx reads the query: `+` is a space, `%XX` a byte.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Applies every pending migration; a database already up to date is left alone.
///
/// # Errors
/// A migration fails, or one already applied was changed since.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(pool).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_tls_file_in_the_url_is_named_with_its_setting() {
        let url = "postgres://u:pw@db.invalid/app?sslmode=verify-full";
        let refused = check_tls_files(&format!("{url}&ssl-ca=/no/such/ca.pem"))
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("sslrootcert in DATABASE_URL: cannot read /no/such/ca.pem"),
            "{refused}"
        );
        assert!(!refused.contains("pw"), "{refused}");
        // Decoded as sqlx decodes it; the last of a repeated key wins.
        let readable = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        let refused = check_tls_files(&format!(
            "{url}&sslkey={readable}&sslkey=/no/such%20dir/client+key.pem"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            refused.contains("sslkey in DATABASE_URL: cannot read /no/such dir/client key.pem"),
            "{refused}"
        );
        // Without TLS nothing is read, so nothing is checked.
        let off = "postgres://db.invalid/app?sslmode=disable&sslcert=/no/such/client.pem";
        check_tls_files(off).unwrap();
    }
}
