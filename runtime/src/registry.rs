//! Where the Schema Registry is and how to reach it: HTTPS with an extra CA,
//! basic auth (Confluent's `user:password` user info, or a user and a
//! password) or a bearer token. Secrets are never printed.

use std::path::PathBuf;

use clap::Args;
use secrecy::{ExposeSecret as _, SecretString};

use crate::settings::{SecurityError, readable_file, secret, secret_from_file};

/// The registry's address and credentials. `Debug` shows the URL without
/// its user info or query (`redact.rs`) and no secret.
#[derive(Clone, Default, Args)]
pub struct RegistryConfig {
    /// Confluent-compatible Schema Registry; when unset, JSON on the wire
    /// (either encoding is read).
    #[arg(long, env = "SCHEMA_REGISTRY_URL")]
    pub schema_registry_url: Option<String>,

    /// Basic auth as `user:password`, Confluent's `basic.auth.user.info` (a secret).
    #[arg(long, env = "SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO", hide_env_values = true, value_parser = secret)]
    pub schema_registry_basic_auth_user_info: Option<SecretString>,

    /// Basic auth user, with `SCHEMA_REGISTRY_PASSWORD`.
    #[arg(
        long,
        env = "SCHEMA_REGISTRY_USERNAME",
        conflicts_with = "schema_registry_basic_auth_user_info"
    )]
    pub schema_registry_username: Option<String>,

    /// Basic auth password (a secret).
    #[arg(long, env = "SCHEMA_REGISTRY_PASSWORD", hide_env_values = true, value_parser = secret, requires = "schema_registry_username")]
    pub schema_registry_password: Option<SecretString>,

    /// A file holding the basic auth password, instead of `SCHEMA_REGISTRY_PASSWORD`.
    #[arg(long, env = "SCHEMA_REGISTRY_PASSWORD_FILE", value_parser = secret_from_file, requires = "schema_registry_username", conflicts_with = "schema_registry_password")]
    pub schema_registry_password_file: Option<SecretString>,

    /// A bearer token (a secret), instead of basic auth.
    #[arg(long, env = "SCHEMA_REGISTRY_BEARER_TOKEN", hide_env_values = true, value_parser = secret, conflicts_with_all = ["schema_registry_basic_auth_user_info", "schema_registry_username"])]
    pub schema_registry_bearer_token: Option<SecretString>,

    /// A file holding the bearer token (re-read at start-up only).
    #[arg(long, env = "SCHEMA_REGISTRY_BEARER_TOKEN_FILE", value_parser = secret_from_file, conflicts_with_all = ["schema_registry_basic_auth_user_info", "schema_registry_username", "schema_registry_bearer_token"])]
    pub schema_registry_bearer_token_file: Option<SecretString>,

    /// PEM file of extra certificate authorities for an HTTPS registry
    /// (added to the system's roots).
    #[arg(long, env = "SCHEMA_REGISTRY_SSL_CA_LOCATION", value_parser = readable_file)]
    pub schema_registry_ssl_ca_location: Option<PathBuf>,
}

impl std::fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let credentials = match self.credentials() {
            RegistryCredentials::None => "none",
            RegistryCredentials::Basic { .. } => "basic",
            RegistryCredentials::Bearer(_) => "bearer",
        };
        f.debug_struct("RegistryConfig")
            .field("url", &self.url().map(crate::redact::url))
            .field("credentials", &credentials)
            .field("ca", &self.schema_registry_ssl_ca_location)
            .finish()
    }
}

/// How a request to the registry proves who sends it.
#[derive(Debug, Clone)]
pub enum RegistryCredentials {
    None,
    Basic {
        user: String,
        password: Option<SecretString>,
    },
    Bearer(SecretString),
}

impl RegistryConfig {
    /// A registry at `url` without credentials or extra CA.
    #[must_use]
    pub fn new(url: &str) -> Self {
        Self {
            schema_registry_url: Some(url.to_owned()),
            ..Self::default()
        }
    }

    /// The URL, when one is configured (an empty one counts as none).
    #[must_use]
    pub fn url(&self) -> Option<&str> {
        self.schema_registry_url
            .as_deref()
            .map(str::trim)
            .filter(|url| !url.is_empty())
    }

    /// The credentials the settings name.
    #[must_use]
    pub fn credentials(&self) -> RegistryCredentials {
        if let Some(token) = self
            .schema_registry_bearer_token
            .as_ref()
            .or(self.schema_registry_bearer_token_file.as_ref())
        {
            return RegistryCredentials::Bearer(token.clone());
        }
        if let Some(info) = &self.schema_registry_basic_auth_user_info {
            let (user, password) = info
                .expose_secret()
                .split_once(':')
                .unwrap_or((info.expose_secret(), ""));
            return RegistryCredentials::Basic {
                user: user.to_owned(),
                password: Some(SecretString::from(password)),
            };
        }
        match &self.schema_registry_username {
            Some(user) => RegistryCredentials::Basic {
                user: user.clone(),
                password: self
                    .schema_registry_password
                    .as_ref()
                    .or(self.schema_registry_password_file.as_ref())
                    .cloned(),
            },
            None => RegistryCredentials::None,
        }
    }

    /// Refuses settings that cannot work, naming the one to fix.
    ///
    /// # Errors
    /// The URL is not http(s), the user info has no `:`, or credentials or
    /// a CA are given without a registry.
    pub fn validate(&self) -> Result<(), SecurityError> {
        let error = |setting, problem: &str| SecurityError {
            setting,
            problem: problem.to_owned(),
        };
        let Some(url) = self.url() else {
            if !matches!(self.credentials(), RegistryCredentials::None)
                || self.schema_registry_ssl_ca_location.is_some()
            {
                return Err(error(
                    "SCHEMA_REGISTRY_URL",
                    "registry credentials or a CA are set, but no registry URL",
                ));
            }
            return Ok(());
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(error(
                "SCHEMA_REGISTRY_URL",
                &format!(
                    "{} is not an http:// or https:// URL",
                    crate::redact::url(url)
                ),
            ));
        }
        if self
            .schema_registry_basic_auth_user_info
            .as_ref()
            .is_some_and(|info| !info.expose_secret().contains(':'))
        {
            return Err(error(
                "SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO",
                "must be user:password",
            ));
        }
        if let Some(ca) = &self.schema_registry_ssl_ca_location {
            crate::tls::certificates(ca)
                .map_err(|e| error("SCHEMA_REGISTRY_SSL_CA_LOCATION", &e.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        registry: RegistryConfig,
    }

    fn parse(args: &[&str]) -> Result<RegistryConfig, clap::Error> {
        Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied())).map(|c| c.registry)
    }

    #[test]
    fn user_info_splits_at_the_first_colon_and_stays_secret() {
        let registry = parse(&[
            "--schema-registry-url",
            "https://registry.example",
            "--schema-registry-basic-auth-user-info",
            "svc:pa:ss",
        ])
        .unwrap();
        registry.validate().unwrap();
        let RegistryCredentials::Basic { user, password } = registry.credentials() else {
            panic!("basic auth expected");
        };
        assert_eq!(user, "svc");
        assert_eq!(password.unwrap().expose_secret(), "pa:ss");
        assert!(!format!("{registry:?}").contains("pa:ss"));
    }

    #[test]
    fn credentials_in_the_url_never_reach_the_logs() {
        let registry = parse(&[
            "--schema-registry-url",
            "https://svc:hunter2@registry.example/?key=k",
        ])
        .unwrap();
        let shown = format!("{registry:?}");
        assert!(shown.contains("registry.example"), "{shown}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("key=k"),
            "{shown}"
        );
        let refused = parse(&[
            "--schema-registry-url",
            "ftp://svc:hunter2@registry.example",
        ])
        .unwrap()
        .validate()
        .unwrap_err();
        assert!(!refused.to_string().contains("hunter2"), "{refused}");
    }

    #[test]
    fn a_bearer_token_excludes_basic_auth() {
        let both = parse(&[
            "--schema-registry-bearer-token",
            "t",
            "--schema-registry-username",
            "u",
        ]);
        assert!(both.is_err());
        let token = parse(&[
            "--schema-registry-url",
            "http://r",
            "--schema-registry-bearer-token",
            "t0k",
        ])
        .unwrap();
        assert!(
            matches!(token.credentials(), RegistryCredentials::Bearer(t) if t.expose_secret() == "t0k")
        );
    }

    #[test]
    fn misconfigurations_are_refused_naming_the_setting() {
        let cases: [(&[&str], &str); 3] = [
            (
                &["--schema-registry-url", "registry:8081"],
                "SCHEMA_REGISTRY_URL",
            ),
            (
                &[
                    "--schema-registry-url",
                    "http://r",
                    "--schema-registry-basic-auth-user-info",
                    "no-colon",
                ],
                "SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO",
            ),
            // An empty URL, not an absent one: the test's environment may set one.
            (
                &[
                    "--schema-registry-url",
                    "",
                    "--schema-registry-username",
                    "u",
                ],
                "SCHEMA_REGISTRY_URL",
            ),
        ];
        for (args, named) in cases {
            let refused = parse(args).unwrap().validate().unwrap_err();
            assert_eq!(refused.setting, named, "{args:?}: {refused}");
        }
        let not_pem = std::env::temp_dir().join(format!("not-a-ca-{}.pem", std::process::id()));
        std::fs::write(&not_pem, "hello").unwrap();
        let refused = parse(&[
            "--schema-registry-url",
            "https://r",
            "--schema-registry-ssl-ca-location",
            not_pem.to_str().unwrap(),
        ])
        .unwrap()
        .validate()
        .unwrap_err();
        assert_eq!(refused.setting, "SCHEMA_REGISTRY_SSL_CA_LOCATION");
        std::fs::remove_file(not_pem).unwrap();
    }
}
