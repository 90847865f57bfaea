//! How the Kafka clients authenticate and encrypt: the named settings of the
//! usual managed-Kafka setups (TLS, SASL PLAIN / SCRAM / OAUTHBEARER, client
//! certificates) and a pass-through for any other librdkafka property.
//!
//! Files (passwords, the properties file) are read while the settings are
//! parsed, so a missing file stops the process at start-up naming its
//! setting; [`KafkaSecurity::validate`] then checks the combination and lets
//! librdkafka check every property before any client exists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use secrecy::{ExposeSecret as _, SecretString};

use crate::settings::{readable_file, secret, secret_from_file};

/// `security.protocol`: how the connection to a broker is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    fn as_librdkafka(self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }

    fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// `sasl.mechanisms`: how a SASL client proves who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SaslMechanism {
    #[value(name = "PLAIN")]
    Plain,
    #[value(name = "SCRAM-SHA-256")]
    ScramSha256,
    #[value(name = "SCRAM-SHA-512")]
    ScramSha512,
    /// Tokens from an OpenID Connect provider: set `sasl.oauthbearer.method=oidc`
    /// and its client id, secret and token endpoint as Kafka properties.
    #[value(name = "OAUTHBEARER")]
    OAuthBearer,
}

impl SaslMechanism {
    fn as_librdkafka(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
            Self::OAuthBearer => "OAUTHBEARER",
        }
    }

    fn needs_password(self) -> bool {
        !matches!(self, Self::OAuthBearer)
    }
}

/// Extra librdkafka properties, as `key=value` pairs. Values may be secrets
/// (`sasl.password`, `ssl.key.password`): `Debug` shows the keys only.
#[derive(Clone, Default)]
pub struct KafkaProperties(pub Vec<(String, String)>);

impl std::fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        keys_only(&self.0, f)
    }
}

/// `key=value` pairs shown by their keys: a value may be a secret.
fn keys_only(pairs: &[(String, String)], f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    f.debug_list()
        .entries(pairs.iter().map(|(key, _)| key))
        .finish()
}

/// TLS and SASL for every producer, consumer and admin client.
///
/// Applied in this order, later winning: the properties file, the named
/// settings that are set, then each `--kafka-property`. `Debug` shows no
/// secret: passwords are [`SecretString`]s, properties show their keys only.
#[derive(Clone, Default, Args)]
pub struct KafkaSecurity {
    /// How clients connect to the brokers (librdkafka's default: PLAINTEXT).
    #[arg(long, env = "KAFKA_SECURITY_PROTOCOL", value_enum, ignore_case = true)]
    pub kafka_security_protocol: Option<SecurityProtocol>,

    /// The SASL mechanism, with a SASL_* protocol.
    #[arg(long, env = "KAFKA_SASL_MECHANISM", value_enum, ignore_case = true)]
    pub kafka_sasl_mechanism: Option<SaslMechanism>,

    /// The SASL user (PLAIN and SCRAM).
    #[arg(long, env = "KAFKA_SASL_USERNAME")]
    pub kafka_sasl_username: Option<String>,

    /// The SASL password (a secret: never printed).
    #[arg(long, env = "KAFKA_SASL_PASSWORD", hide_env_values = true, value_parser = secret)]
    pub kafka_sasl_password: Option<SecretString>,

    /// A file holding the SASL password (a mounted secret), instead of
    /// `KAFKA_SASL_PASSWORD`.
    #[arg(long, env = "KAFKA_SASL_PASSWORD_FILE", value_parser = secret_from_file, conflicts_with = "kafka_sasl_password")]
    pub kafka_sasl_password_file: Option<SecretString>,

    /// PEM file of the certificate authorities that sign the brokers'
    /// certificates (default: the system's roots).
    #[arg(long, env = "KAFKA_SSL_CA_LOCATION", value_parser = readable_file)]
    pub kafka_ssl_ca_location: Option<PathBuf>,

    /// PEM file of this client's certificate, for brokers that require one.
    #[arg(long, env = "KAFKA_SSL_CERTIFICATE_LOCATION", value_parser = readable_file, requires = "kafka_ssl_key_location")]
    pub kafka_ssl_certificate_location: Option<PathBuf>,

    /// PEM file of this client's private key.
    #[arg(long, env = "KAFKA_SSL_KEY_LOCATION", value_parser = readable_file, requires = "kafka_ssl_certificate_location")]
    pub kafka_ssl_key_location: Option<PathBuf>,

    /// The private key's passphrase, when it has one (a secret).
    #[arg(long, env = "KAFKA_SSL_KEY_PASSWORD", hide_env_values = true, value_parser = secret)]
    pub kafka_ssl_key_password: Option<SecretString>,

    /// A file holding the private key's passphrase, instead of `KAFKA_SSL_KEY_PASSWORD`.
    #[arg(long, env = "KAFKA_SSL_KEY_PASSWORD_FILE", value_parser = secret_from_file, conflicts_with = "kafka_ssl_key_password")]
    pub kafka_ssl_key_password_file: Option<SecretString>,

    /// A Java-style properties file of librdkafka properties (for example a
    /// managed service's client.properties).
    #[arg(long, env = "FLOTILLA_KAFKA_PROPERTIES_FILE", value_parser = properties_file)]
    pub kafka_properties_file: Option<KafkaProperties>,

    /// Any librdkafka property, as `key=value`; repeatable.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", value_parser = property)]
    pub kafka_property: Vec<(String, String)>,
}

impl std::fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        /// `--kafka-property` values may be secrets (`sasl.password=...`).
        struct Keys<'a>(&'a [(String, String)]);
        impl std::fmt::Debug for Keys<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                keys_only(self.0, f)
            }
        }
        // Taken apart, so that a new field cannot be left out unseen.
        let Self {
            kafka_security_protocol,
            kafka_sasl_mechanism,
            kafka_sasl_username,
            kafka_sasl_password,
            kafka_sasl_password_file,
            kafka_ssl_ca_location,
            kafka_ssl_certificate_location,
            kafka_ssl_key_location,
            kafka_ssl_key_password,
            kafka_ssl_key_password_file,
            kafka_properties_file,
            kafka_property,
        } = self;
        f.debug_struct("KafkaSecurity")
            .field("kafka_security_protocol", kafka_security_protocol)
            .field("kafka_sasl_mechanism", kafka_sasl_mechanism)
            .field("kafka_sasl_username", kafka_sasl_username)
            .field("kafka_sasl_password", kafka_sasl_password)
            .field("kafka_sasl_password_file", kafka_sasl_password_file)
            .field("kafka_ssl_ca_location", kafka_ssl_ca_location)
            .field(
                "kafka_ssl_certificate_location",
                kafka_ssl_certificate_location,
            )
            .field("kafka_ssl_key_location", kafka_ssl_key_location)
            .field("kafka_ssl_key_password", kafka_ssl_key_password)
            .field("kafka_ssl_key_password_file", kafka_ssl_key_password_file)
            .field("kafka_properties_file", kafka_properties_file)
            .field("kafka_property", &Keys(kafka_property))
            .finish()
    }
}

pub use crate::settings::SecurityError;

impl KafkaSecurity {
    /// Every property this adds to a client, in the order they apply.
    fn properties(&self) -> Vec<(String, String)> {
        let mut properties: Vec<(String, String)> = self
            .kafka_properties_file
            .iter()
            .flat_map(|file| file.0.iter().cloned())
            .collect();
        let mut named = |key: &str, value: String| properties.push((key.to_owned(), value));
        if let Some(protocol) = self.kafka_security_protocol {
            named("security.protocol", protocol.as_librdkafka().to_owned());
        }
        if let Some(mechanism) = self.kafka_sasl_mechanism {
            named("sasl.mechanisms", mechanism.as_librdkafka().to_owned());
        }
        if let Some(user) = &self.kafka_sasl_username {
            named("sasl.username", user.clone());
        }
        if let Some(password) = self.sasl_password() {
            named("sasl.password", password.expose_secret().to_owned());
        }
        let path = |p: &Path| p.display().to_string();
        if let Some(ca) = &self.kafka_ssl_ca_location {
            named("ssl.ca.location", path(ca));
        }
        if let Some(certificate) = &self.kafka_ssl_certificate_location {
            named("ssl.certificate.location", path(certificate));
        }
        if let Some(key) = &self.kafka_ssl_key_location {
            named("ssl.key.location", path(key));
        }
        if let Some(password) = self
            .kafka_ssl_key_password
            .as_ref()
            .or(self.kafka_ssl_key_password_file.as_ref())
        {
            named("ssl.key.password", password.expose_secret().to_owned());
        }
        properties.extend(self.kafka_property.iter().cloned());
        // One spelling per property, so the later setting wins for sure
        // (a client configuration applies its keys in no fixed order).
        properties
            .into_iter()
            .map(|(key, value)| (super::pinned::canonical(&key).to_owned(), value))
            .collect()
    }

    /// The keys set through the properties file and `--kafka-property`.
    pub fn pass_through_keys(&self) -> impl Iterator<Item = &str> {
        self.kafka_properties_file
            .iter()
            .flat_map(|file| file.0.iter())
            .chain(&self.kafka_property)
            .map(|(key, _)| key.as_str())
    }

    fn sasl_password(&self) -> Option<&SecretString> {
        self.kafka_sasl_password
            .as_ref()
            .or(self.kafka_sasl_password_file.as_ref())
    }

    /// Adds every property to `config`.
    pub fn apply(&self, config: &mut ClientConfig) {
        for (key, value) in self.properties() {
            config.set(key, value);
        }
    }

    /// Refuses a combination that cannot work, naming the setting to fix,
    /// then has librdkafka check every property (names and values).
    ///
    /// # Errors
    /// The first problem found.
    pub fn validate(&self, base: &ClientConfig) -> Result<(), SecurityError> {
        let error = |setting, problem: &str| SecurityError {
            setting,
            problem: problem.to_owned(),
        };
        if let Some(refused) = self.pass_through_keys().find_map(super::pinned::refusal) {
            return Err(error("Kafka properties", &refused));
        }
        let effective: BTreeMap<String, String> = self.properties().into_iter().collect();
        let protocol = effective
            .get("security.protocol")
            .map(|p| p.to_ascii_lowercase());
        let uses_sasl = protocol
            .as_deref()
            .is_some_and(|p| p == "sasl_plaintext" || p == "sasl_ssl");
        if let Some(mechanism) = self.kafka_sasl_mechanism {
            if !uses_sasl {
                return Err(error(
                    "KAFKA_SASL_MECHANISM",
                    "is set but KAFKA_SECURITY_PROTOCOL is not SASL_PLAINTEXT or SASL_SSL",
                ));
            }
            let has = |key: &str| effective.get(key).is_some_and(|v| !v.is_empty());
            if mechanism.needs_password() && !has("sasl.username") {
                return Err(error(
                    "KAFKA_SASL_USERNAME",
                    &format!("{} needs a user name", mechanism.as_librdkafka()),
                ));
            }
            if mechanism.needs_password() && !has("sasl.password") {
                return Err(error(
                    "KAFKA_SASL_PASSWORD",
                    &format!(
                        "{} needs a password (or KAFKA_SASL_PASSWORD_FILE)",
                        mechanism.as_librdkafka()
                    ),
                ));
            }
        } else if self
            .kafka_security_protocol
            .is_some_and(SecurityProtocol::uses_sasl)
            && !effective.contains_key("sasl.mechanisms")
        {
            return Err(error(
                "KAFKA_SASL_MECHANISM",
                "a SASL protocol needs a mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER)",
            ));
        }
        // librdkafka knows every property and its values: ask it before any
        // client exists. Its message names the property.
        let mut config = base.clone();
        self.apply(&mut config);
        config
            .create_native_config()
            .map_err(|e| error("Kafka properties", &e.to_string()))?;
        Ok(())
    }
}

/// Whether the broker refused who this client is (TLS or SASL
/// authentication) or what it may do (an ACL on a topic, the group or the
/// cluster): an outage for an operator to fix, never the fault of a message.
#[must_use]
pub fn is_refused_access(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    error.rdkafka_error_code().is_some_and(|code| {
        matches!(
            code,
            Code::Authentication
                | Code::SaslAuthenticationFailed
                | Code::SSL
                | Code::TopicAuthorizationFailed
                | Code::GroupAuthorizationFailed
                | Code::ClusterAuthorizationFailed
        )
    })
}

/// Whether the broker refused a record for the record itself (too large,
/// invalid): sending the same bytes again will fail again.
#[must_use]
pub fn is_refused_for_itself(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        code,
        Code::MessageSizeTooLarge
            | Code::InvalidMessageSize
            | Code::InvalidMessage
            | Code::InvalidRecord
            | Code::MessageBatchTooLarge
    )
}

fn property(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err(format!("{text:?} is not key=value")),
    }
}

fn properties_file(path: &str) -> Result<KafkaProperties, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let read = java_properties::read(std::io::BufReader::new(file))
        .map_err(|e| format!("{path} is not a properties file: {e}"))?;
    // Sorted, so the order properties apply in does not depend on a hash.
    let sorted: BTreeMap<String, String> = read.into_iter().collect();
    Ok(KafkaProperties(sorted.into_iter().collect()))
}

#[cfg(test)]
mod tests;
