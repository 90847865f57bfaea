//! The wire codec every Flotilla binary uses: JSON when no Schema Registry is
//! configured, Confluent-framed Avro through the registry when one is. The
//! decoder accepts either encoding, whatever this side is configured to write.
//!
//! The bytes of an Avro message are produced by `flotilla-contracts`; this
//! crate only resolves schema ids with the registry (registering our schemas
//! under the topic-name strategy, `<topic>-value`).

use std::time::Duration;

use flotilla_contracts::avro::{self, AvroMessage};
use flotilla_contracts::framing::{self, Framed};
use flotilla_contracts::{DecodeError, RuleViolation, json};
use flotilla_runtime::registry::{RegistryConfig, RegistryCredentials};
use schema_registry_converter::async_impl::avro::{AvroDecoder, AvroEncoder};
use schema_registry_converter::async_impl::schema_registry::{SrSettings, get_schema_by_id};
use schema_registry_converter::avro_common::get_supplied_schema;
use schema_registry_converter::error::SRCError;
use schema_registry_converter::schema_registry_common::{SchemaType, SubjectNameStrategy};
use secrecy::ExposeSecret;

/// How long one registry request may take before it counts as unavailable.
const REGISTRY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a message could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The bytes are not a valid message and never will be: dead-letter them.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The message breaks a rule; it was not encoded.
    #[error(transparent)]
    Rule(#[from] RuleViolation),
    /// The registry could not be asked; the same call may succeed later.
    #[error("schema registry unavailable: {0}")]
    RegistryUnavailable(String),
    /// The registry refused our schema (for example an incompatible change).
    #[error("schema registry refused the schema for subject {subject}: {reason}")]
    RegistryRefused { subject: String, reason: String },
    /// The registry's settings cannot be used (a bad CA file, a bad URL).
    #[error("schema registry settings: {0}")]
    Settings(String),
    /// An Avro message arrived but this side has no registry to resolve its schema id.
    #[error("Avro message with schema id {0}, but no schema registry is configured")]
    NoRegistry(u32),
}

impl CodecError {
    /// Whether retrying the same bytes later can succeed.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::RegistryUnavailable(_))
    }
}

/// Encodes and decodes contract messages for one configuration.
#[derive(Debug)]
pub struct Codec {
    registry: Option<Registry>,
}

struct Registry {
    /// The URL as errors show it (no user info, no query).
    url: String,
    /// What of the configured URL must not be shown (`redact::secrets_of`).
    secrets: Vec<String>,
    encoder: AvroEncoder,
    decoder: AvroDecoder,
    /// For asking what an id is when the decoder gives up on it.
    settings: SrSettings,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("url", &self.url).finish()
    }
}

impl Registry {
    /// `error` described, without the secrets of the registry's URL (the
    /// HTTP client's errors quote the URL).
    fn describe(&self, error: &SRCError) -> String {
        flotilla_runtime::redact::scrub(&describe(error), &self.secrets)
    }
}

impl Codec {
    /// A codec that writes JSON and cannot resolve Avro schema ids.
    #[must_use]
    pub fn json() -> Self {
        Self { registry: None }
    }

    /// A codec that writes Avro through the registry at `url`, without
    /// credentials (tests and local setups).
    ///
    /// # Errors
    /// The URL cannot be used to build an HTTP client.
    pub fn with_registry(url: &str) -> Result<Self, CodecError> {
        Self::from_config(&RegistryConfig::new(url))
    }

    /// Avro through the registry the settings name (its credentials and
    /// extra CA included), or JSON when they name none.
    ///
    /// # Errors
    /// The CA file cannot be used, or no HTTP client can be built.
    pub fn from_config(config: &RegistryConfig) -> Result<Self, CodecError> {
        let Some(url) = config.url() else {
            return Ok(Self::json());
        };
        let settings = || {
            let mut client = flotilla_runtime::tls::http_client();
            if let Some(ca) = &config.schema_registry_ssl_ca_location {
                let roots = flotilla_runtime::tls::certificates(ca)
                    .map_err(|e| CodecError::Settings(e.to_string()))?;
                client = client.tls_certs_merge(roots);
            }
            let mut builder = SrSettings::new_builder(url.to_owned());
            builder.set_timeout(REGISTRY_TIMEOUT);
            match config.credentials() {
                RegistryCredentials::None => {}
                RegistryCredentials::Basic { user, password } => {
                    builder.set_basic_authorization(
                        &user,
                        password.as_ref().map(ExposeSecret::expose_secret),
                    );
                }
                RegistryCredentials::Bearer(token) => {
                    builder.set_token_authorization(token.expose_secret());
                }
            }
            builder.build_with(client).map_err(|e| {
                let shown = flotilla_runtime::redact::url(url);
                let secrets = flotilla_runtime::redact::secrets_of(url);
                let error = flotilla_runtime::redact::scrub(&e.to_string(), &secrets);
                CodecError::Settings(format!("{shown}: {error}"))
            })
        };
        Ok(Self {
            registry: Some(Registry {
                url: flotilla_runtime::redact::url(url),
                secrets: flotilla_runtime::redact::secrets_of(url),
                encoder: AvroEncoder::new(settings()?),
                decoder: AvroDecoder::new(settings()?),
                settings: settings()?,
            }),
        })
    }

    /// The `content-type` this codec writes.
    #[must_use]
    pub fn content_type(&self) -> &'static str {
        match self.registry {
            Some(_) => "application/vnd.flotilla.avro",
            None => "application/json",
        }
    }

    /// Registers (or finds) `M`'s schema under `<topic>-value` and returns its id.
    ///
    /// # Errors
    /// No registry configured is reported as [`CodecError::NoRegistry`] with id 0;
    /// otherwise registry errors.
    pub async fn schema_id<M: AvroMessage>(&self, topic: &str) -> Result<u32, CodecError> {
        let registry = self.registry.as_ref().ok_or(CodecError::NoRegistry(0))?;
        registry.schema_id::<M>(topic).await
    }

    /// Encodes `message` for `topic`.
    ///
    /// # Errors
    /// The message breaks a rule, or the registry cannot be reached or refuses the schema.
    pub async fn encode<M: AvroMessage>(
        &self,
        topic: &str,
        message: &M,
    ) -> Result<Vec<u8>, CodecError> {
        match &self.registry {
            None => Ok(json::encode(message)?),
            Some(registry) => {
                let schema_id = registry.schema_id::<M>(topic).await?;
                Ok(framing::frame(schema_id, &avro::encode_datum(message)?))
            }
        }
    }

    /// Decodes either encoding, telling them apart by the first byte.
    ///
    /// # Errors
    /// [`CodecError::Decode`] for bytes that can never be a valid `M`;
    /// [`CodecError::RegistryUnavailable`] when the schema id could not be
    /// resolved right now; [`CodecError::NoRegistry`] for Avro without a registry.
    pub async fn decode<M: AvroMessage>(&self, bytes: &[u8]) -> Result<M, CodecError> {
        match framing::detect(bytes)? {
            Framed::Json(text) => Ok(json::decode(text)?),
            Framed::Avro { schema_id, datum } => {
                let registry = self
                    .registry
                    .as_ref()
                    .ok_or(CodecError::NoRegistry(schema_id))?;
                let writer = registry.writer_schema(schema_id).await?;
                let found = writer.parsed.name().map(ToString::to_string);
                if found.as_deref() != Some(M::AVRO_NAME) {
                    return Err(DecodeError::WrongSchema {
                        schema_id,
                        expected: M::AVRO_NAME,
                        found: found.unwrap_or_else(|| "an unnamed schema".into()),
                    }
                    .into());
                }
                Ok(avro::decode_datum::<M>(&writer.parsed, datum)?)
            }
        }
    }
}

impl Registry {
    async fn schema_id<M: AvroMessage>(&self, topic: &str) -> Result<u32, CodecError> {
        let subject = format!("{topic}-value");
        let strategy = SubjectNameStrategy::TopicNameStrategyWithSchema(
            topic.to_owned(),
            false,
            get_supplied_schema(M::avro_schema()),
        );
        match self.encoder.get_schema_and_id(&subject, strategy).await {
            Ok(schema) => Ok(schema.id),
            Err(e) if e.retriable || !is_schema_refused(&e) => {
                // Refused credentials (401, 403), a 5xx, a proxy's answer:
                // the world's fault. Nothing is cached, so it is asked again.
                self.encoder.remove_errors_from_cache();
                Err(CodecError::RegistryUnavailable(self.describe(&e)))
            }
            Err(e) => {
                // A refusal is cached by the encoder; drop it so a fixed registry is seen.
                self.encoder.remove_errors_from_cache();
                Err(CodecError::RegistryRefused {
                    subject,
                    reason: flotilla_runtime::redact::scrub(&e.to_string(), &self.secrets),
                })
            }
        }
    }

    async fn writer_schema(
        &self,
        schema_id: u32,
    ) -> Result<std::sync::Arc<schema_registry_converter::avro_common::AvroSchema>, CodecError>
    {
        match self.decoder.get_schema(schema_id).await {
            Ok(schema) => Ok(schema),
            Err(e) => {
                // Only successes are cached: the decoder keeps errors it
                // thinks final, and a registry that answered 500 once would
                // refuse this id for the life of the process.
                self.decoder.remove_errors_from_cache();
                if is_definitely_not_found(&e) {
                    return Err(DecodeError::UnknownSchemaId(schema_id).into());
                }
                if !e.retriable
                    && let Some(verdict) = self.definite_answer_about(schema_id).await
                {
                    return Err(verdict.into());
                }
                Err(CodecError::RegistryUnavailable(format!(
                    "resolving schema id {schema_id} at {}: {}",
                    self.url,
                    self.describe(&e)
                )))
            }
        }
    }
}

impl Registry {
    /// The decoder gave up on `schema_id` for good, which it also does for
    /// refused credentials or a proxy's page: asks the registry for the id
    /// itself, and only a schema it returns that is not Avro, or Avro text
    /// that does not parse, condemns the message. `None`: the answer says
    /// nothing definite about the id (the world's fault).
    async fn definite_answer_about(&self, schema_id: u32) -> Option<DecodeError> {
        let found = get_schema_by_id(schema_id, &self.settings).await.ok()?;
        // A schema with references needs them fetched too; its failure may
        // be the world's (a refused reference), so it says nothing definite.
        if !found.references.is_empty() {
            return None;
        }
        let kind = match &found.schema_type {
            SchemaType::Avro => {
                return apache_avro::Schema::parse_str(&found.schema)
                    .err()
                    .map(|e| DecodeError::SchemaDoesNotParse {
                        schema_id,
                        reason: e.to_string(),
                    });
            }
            SchemaType::Protobuf => "Protobuf".to_owned(),
            SchemaType::Json => "JSON Schema".to_owned(),
            SchemaType::Other(other) => other.clone(),
            // A kind this library learns later: still not Avro.
            other => format!("{other:?}"),
        };
        Some(DecodeError::NotAvroSchema { schema_id, kind })
    }
}

/// Only a registry's definite answer that the id does not exist (HTTP 404
/// with its error code 40403) condemns a message; a 5xx, a 429, a timeout,
/// an auth failure, a 404 from something that is not a registry, an answer
/// that does not parse: all are the world's fault, and the message waits.
fn is_definitely_not_found(error: &SRCError) -> bool {
    error.error.contains("status 404")
        && error
            .cause
            .as_deref()
            .is_some_and(|cause| cause.starts_with("error_code: 40403"))
}

/// Only the registry's verdict on the schema itself (409: incompatible with
/// the subject's history; 422: not a valid schema) refuses it; every other
/// failure is an outage.
fn is_schema_refused(error: &SRCError) -> bool {
    error.error.contains("status 409") || error.error.contains("status 422")
}

/// The registry's error in one line: what failed and why.
fn describe(error: &SRCError) -> String {
    match &error.cause {
        Some(cause) => format!("{} ({cause})", error.error),
        None => error.error.clone(),
    }
}
