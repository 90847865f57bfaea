//! The Avro encoding: the embedded schemas, the mapping between the messages
//! and Avro values, and datum encode/decode without a registry.
//!
//! JSON documents (`input`, `result`) travel as Avro strings holding JSON
//! text: Avro has no type for arbitrary JSON, and a string keeps the schema
//! stable whatever the workflows carry.

use std::collections::HashMap;
use std::sync::OnceLock;

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{
    DecodeError, Message, RuleViolation, StepRequestParts, WorkflowRunEvent, WorkflowRunEventType,
    WorkflowRunRequest, WorkflowRunSignal, WorkflowStepReply, WorkflowStepRequest,
};

/// A message with an Avro form.
pub trait AvroMessage: Message {
    /// The parsed embedded schema.
    fn avro_schema() -> &'static Schema;

    /// The message as an Avro record value of [`AvroMessage::avro_schema`].
    fn to_avro_value(&self) -> Value;

    /// Reads a record value (as resolved against our schema) and checks the rules.
    ///
    /// # Errors
    /// [`DecodeError::AvroMismatch`] naming the field, or [`DecodeError::Rule`].
    fn from_avro_value(value: Value) -> Result<Self, DecodeError>;
}

fn parse_embedded(cell: &'static OnceLock<Schema>, text: &'static str) -> &'static Schema {
    // The schema text is part of this crate and covered by its tests.
    cell.get_or_init(|| Schema::parse_str(text).expect("embedded .avsc schemas are valid Avro"))
}

/// Encodes the message as a bare Avro datum (no framing).
///
/// # Errors
/// The message breaks a rule.
pub fn encode_datum<M: AvroMessage>(message: &M) -> Result<Vec<u8>, RuleViolation> {
    message.check_rules()?;
    // Our values are built from our own schema, so writing them cannot fail.
    let written = GenericDatumWriter::builder(M::avro_schema())
        .build()
        .and_then(|writer| writer.write_value_to_vec(message.to_avro_value()));
    Ok(written.expect("a message's Avro value matches its own schema"))
}

/// Decodes a bare Avro datum written with `writer_schema`, resolving it
/// against our schema, and checks the rules.
///
/// # Errors
/// [`DecodeError::AvroMismatch`] when the bytes are not a datum of the writer
/// schema (truncated, trailing bytes, wrong shape) or the writer schema cannot
/// be resolved to ours; [`DecodeError::Rule`].
pub fn decode_datum<M: AvroMessage>(
    writer_schema: &Schema,
    datum: &[u8],
) -> Result<M, DecodeError> {
    let mismatch = |reason: String| DecodeError::AvroMismatch {
        schema: M::AVRO_NAME,
        reason,
    };
    let reader = GenericDatumReader::builder(writer_schema)
        .reader_schema(M::avro_schema())
        .build()
        .map_err(|e| mismatch(e.to_string()))?;
    let mut cursor = datum;
    let value = reader
        .read_value(&mut cursor)
        .map_err(|e| mismatch(e.to_string()))?;
    if !cursor.is_empty() {
        return Err(mismatch(format!(
            "{} trailing bytes after the record",
            cursor.len()
        )));
    }
    M::from_avro_value(value)
}

/// `avro_schema` for a message: its embedded schema, parsed once.
macro_rules! embedded_schema {
    () => {
        fn avro_schema() -> &'static Schema {
            static SCHEMA: OnceLock<Schema> = OnceLock::new();
            parse_embedded(&SCHEMA, Self::schema_text())
        }
    };
}

impl AvroMessage for WorkflowRunRequest {
    embedded_schema!();

    fn to_avro_value(&self) -> Value {
        Value::Record(vec![
            ("job_id".into(), Value::Uuid(self.job_id())),
            (
                "workflow_name".into(),
                Value::String(self.workflow_name().into()),
            ),
            ("input".into(), Value::String(self.input().to_string())),
            (
                "workflow_version".into(),
                optional_int(self.workflow_version()),
            ),
            ("priority".into(), optional_int(self.priority())),
            ("metadata".into(), optional_map(self.metadata())),
        ])
    }

    fn from_avro_value(value: Value) -> Result<Self, DecodeError> {
        let mut record = Fields::<Self>::of(value)?;
        let job_id = record.uuid("job_id")?;
        let workflow_name = record.string("workflow_name")?;
        let input = record.json("input")?;
        let version = record.optional_int("workflow_version")?;
        let priority = record.optional_int("priority")?;
        let metadata = record.optional_map("metadata")?;
        Ok(Self::new(job_id, workflow_name, input)?
            .with_workflow_version(version)?
            .with_priority(priority)?
            .with_metadata(metadata)?)
    }
}

impl AvroMessage for WorkflowRunSignal {
    embedded_schema!();

    fn to_avro_value(&self) -> Value {
        let source = Some(self.source()).filter(|s| !s.is_null());
        Value::Record(vec![
            ("job_id".into(), Value::Uuid(self.job_id())),
            ("name".into(), Value::String(self.name().into())),
            ("payload".into(), Value::String(self.payload().to_string())),
            (
                "source".into(),
                optional_string(source.map(ToString::to_string).as_deref()),
            ),
            (
                "idempotency_key".into(),
                optional_string(self.idempotency_key()),
            ),
        ])
    }

    fn from_avro_value(value: Value) -> Result<Self, DecodeError> {
        let mut record = Fields::<Self>::of(value)?;
        let job_id = record.uuid("job_id")?;
        let name = record.string("name")?;
        let payload = record.json("payload")?;
        let source = match record.optional_string("source")? {
            None => serde_json::Value::Null,
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| record.mismatch("source", format!("not JSON: {e}")))?,
        };
        let idempotency_key = record.optional_string("idempotency_key")?;
        Ok(Self::new(job_id, name, payload, source, idempotency_key)?)
    }
}

impl AvroMessage for WorkflowStepRequest {
    embedded_schema!();

    fn to_avro_value(&self) -> Value {
        Value::Record(vec![
            ("job_id".into(), Value::Uuid(self.job_id())),
            ("step_name".into(), Value::String(self.step_name().into())),
            ("attempt".into(), Value::Int(self.attempt())),
            ("correlation_id".into(), Value::Uuid(self.correlation_id())),
            (
                "reply_topic".into(),
                Value::String(self.reply_topic().into()),
            ),
            (
                "idempotency_key".into(),
                Value::String(self.idempotency_key().into()),
            ),
            ("request".into(), Value::String(self.request().to_string())),
            (
                "deadline".into(),
                Value::TimestampMicros(self.deadline().timestamp_micros()),
            ),
        ])
    }

    fn from_avro_value(value: Value) -> Result<Self, DecodeError> {
        let mut record = Fields::<Self>::of(value)?;
        let parts = StepRequestParts {
            job_id: record.uuid("job_id")?,
            step_name: record.string("step_name")?,
            attempt: record.int("attempt")?,
            correlation_id: record.uuid("correlation_id")?,
            reply_topic: record.string("reply_topic")?,
            request: record.json("request")?,
            deadline: record.timestamp("deadline")?,
        };
        let key = record.string("idempotency_key")?;
        Ok(WorkflowStepRequest::from_parts(parts, key)?)
    }
}

impl AvroMessage for WorkflowStepReply {
    embedded_schema!();

    fn to_avro_value(&self) -> Value {
        Value::Record(vec![
            ("correlation_id".into(), Value::Uuid(self.correlation_id())),
            ("job_id".into(), Value::Uuid(self.job_id())),
            (
                "result".into(),
                optional_string(self.result().map(ToString::to_string).as_deref()),
            ),
            ("error".into(), optional_string(self.error())),
            ("retryable".into(), Value::Boolean(self.retryable())),
        ])
    }

    fn from_avro_value(value: Value) -> Result<Self, DecodeError> {
        let mut record = Fields::<Self>::of(value)?;
        let correlation_id = record.uuid("correlation_id")?;
        let job_id = record.uuid("job_id")?;
        let result = match record.optional_string("result")? {
            None => None,
            Some(text) => Some(
                serde_json::from_str(&text)
                    .map_err(|e| record.mismatch("result", format!("not JSON: {e}")))?,
            ),
        };
        let error = record.optional_string("error")?;
        let retryable = record.boolean("retryable")?;
        Ok(WorkflowStepReply::build(
            job_id,
            correlation_id,
            result,
            error,
            retryable,
        )?)
    }
}

impl AvroMessage for WorkflowRunEvent {
    embedded_schema!();

    fn to_avro_value(&self) -> Value {
        let event_type = self.event_type();
        let symbol = WorkflowRunEventType::ALL
            .iter()
            .position(|t| *t == event_type)
            .expect("ALL lists every event type");
        Value::Record(vec![
            ("event_id".into(), Value::Uuid(self.event_id())),
            ("job_id".into(), Value::Uuid(self.job_id())),
            ("sequence".into(), Value::Long(self.sequence())),
            (
                "type".into(),
                Value::Enum(symbol as u32, event_type.as_str().into()),
            ),
            (
                "workflow_name".into(),
                Value::String(self.workflow_name().into()),
            ),
            ("attempt".into(), Value::Int(self.attempt())),
            ("step_name".into(), optional_string(self.step_name())),
            ("verdict".into(), optional_string(self.verdict())),
            ("error".into(), optional_string(self.error())),
            (
                "result".into(),
                optional_string(self.result().map(ToString::to_string).as_deref()),
            ),
            (
                "occurred_at".into(),
                Value::TimestampMicros(self.occurred_at().timestamp_micros()),
            ),
            (
                "workflow_version".into(),
                optional_int(self.workflow_version()),
            ),
            ("metadata".into(), optional_map(self.metadata())),
        ])
    }

    fn from_avro_value(value: Value) -> Result<Self, DecodeError> {
        let mut record = Fields::<Self>::of(value)?;
        let type_name = record.enum_symbol("type")?;
        let event_type = WorkflowRunEventType::from_wire(&type_name)
            .ok_or_else(|| record.mismatch("type", format!("unknown symbol {type_name}")))?;
        let header = crate::EventHeader {
            event_id: record.uuid("event_id")?,
            job_id: record.uuid("job_id")?,
            sequence: record.long("sequence")?,
            workflow_name: record.string("workflow_name")?,
            attempt: record.int("attempt")?,
            occurred_at: record.timestamp("occurred_at")?,
        };
        let step_name = record.optional_string("step_name")?;
        let verdict = record.optional_string("verdict")?;
        let error = record.optional_string("error")?;
        let result = match record.optional_string("result")? {
            None => None,
            Some(text) => Some(
                serde_json::from_str::<serde_json::Value>(&text)
                    .map_err(|e| record.mismatch("result", format!("not JSON: {e}")))?,
            )
            .filter(|result| !result.is_null()),
        };
        let version = record.optional_int("workflow_version")?;
        let metadata = record.optional_map("metadata")?;
        let event =
            WorkflowRunEvent::from_parts(header, event_type, step_name, verdict, error, result);
        Ok(event
            .with_workflow_version(version)?
            .with_metadata(metadata)?)
    }
}

fn optional_map(value: Option<&crate::Metadata>) -> Value {
    match value {
        None => Value::Union(0, Box::new(Value::Null)),
        Some(map) => Value::Union(
            1,
            Box::new(Value::Map(
                map.iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect(),
            )),
        ),
    }
}

fn optional_int(value: Option<i32>) -> Value {
    match value {
        None => Value::Union(0, Box::new(Value::Null)),
        Some(n) => Value::Union(1, Box::new(Value::Int(n))),
    }
}

fn optional_string(value: Option<&str>) -> Value {
    match value {
        None => Value::Union(0, Box::new(Value::Null)),
        Some(text) => Value::Union(1, Box::new(Value::String(text.into()))),
    }
}

/// The fields of a decoded record, taken out by name with errors that name
/// the field. Accepts the plain and the logical forms of uuid, enum and
/// timestamp so that a writer schema without logical types still decodes.
struct Fields<M> {
    fields: HashMap<String, Value>,
    _message: std::marker::PhantomData<M>,
}

impl<M: Message> Fields<M> {
    fn of(value: Value) -> Result<Self, DecodeError> {
        match value {
            Value::Record(fields) => Ok(Self {
                fields: fields.into_iter().collect(),
                _message: std::marker::PhantomData,
            }),
            other => Err(DecodeError::AvroMismatch {
                schema: M::AVRO_NAME,
                reason: format!("expected a record, found {other:?}"),
            }),
        }
    }

    fn mismatch(&self, field: &str, reason: impl std::fmt::Display) -> DecodeError {
        DecodeError::AvroMismatch {
            schema: M::AVRO_NAME,
            reason: format!("field {field}: {reason}"),
        }
    }

    fn take(&mut self, field: &str) -> Result<Value, DecodeError> {
        match self.fields.remove(field) {
            Some(Value::Union(_, inner)) => Ok(*inner),
            Some(value) => Ok(value),
            None => Err(self.mismatch(field, "missing")),
        }
    }

    fn string(&mut self, field: &str) -> Result<String, DecodeError> {
        match self.take(field)? {
            Value::String(text) => Ok(text),
            other => Err(self.mismatch(field, format!("expected a string, found {other:?}"))),
        }
    }

    fn optional_string(&mut self, field: &str) -> Result<Option<String>, DecodeError> {
        match self.take(field)? {
            Value::Null => Ok(None),
            Value::String(text) => Ok(Some(text)),
            other => {
                Err(self.mismatch(field, format!("expected null or a string, found {other:?}")))
            }
        }
    }

    fn uuid(&mut self, field: &str) -> Result<Uuid, DecodeError> {
        match self.take(field)? {
            Value::Uuid(id) => Ok(id),
            Value::String(text) => {
                Uuid::parse_str(&text).map_err(|e| self.mismatch(field, format!("not a UUID: {e}")))
            }
            other => Err(self.mismatch(field, format!("expected a UUID, found {other:?}"))),
        }
    }

    fn long(&mut self, field: &str) -> Result<i64, DecodeError> {
        match self.take(field)? {
            Value::Long(n) => Ok(n),
            Value::Int(n) => Ok(n.into()),
            other => Err(self.mismatch(field, format!("expected a long, found {other:?}"))),
        }
    }

    fn boolean(&mut self, field: &str) -> Result<bool, DecodeError> {
        match self.take(field)? {
            Value::Boolean(b) => Ok(b),
            other => Err(self.mismatch(field, format!("expected a boolean, found {other:?}"))),
        }
    }

    fn int(&mut self, field: &str) -> Result<i32, DecodeError> {
        match self.take(field)? {
            Value::Int(n) => Ok(n),
            other => Err(self.mismatch(field, format!("expected an int, found {other:?}"))),
        }
    }

    fn optional_int(&mut self, field: &str) -> Result<Option<i32>, DecodeError> {
        match self.take(field)? {
            Value::Null => Ok(None),
            Value::Int(n) => Ok(Some(n)),
            other => Err(self.mismatch(field, format!("expected null or an int, found {other:?}"))),
        }
    }

    fn optional_map(&mut self, field: &str) -> Result<Option<crate::Metadata>, DecodeError> {
        match self.take(field)? {
            Value::Null => Ok(None),
            Value::Map(entries) => {
                entries
                    .into_iter()
                    .map(|(key, value)| match value {
                        Value::String(text) => Ok((key, text)),
                        other => Err(self
                            .mismatch(field, format!("{key}: expected a string, found {other:?}"))),
                    })
                    .collect::<Result<_, _>>()
                    .map(Some)
            }
            other => Err(self.mismatch(field, format!("expected null or a map, found {other:?}"))),
        }
    }

    fn enum_symbol(&mut self, field: &str) -> Result<String, DecodeError> {
        match self.take(field)? {
            Value::Enum(_, symbol) | Value::String(symbol) => Ok(symbol),
            other => Err(self.mismatch(field, format!("expected an enum, found {other:?}"))),
        }
    }

    fn timestamp(&mut self, field: &str) -> Result<DateTime<Utc>, DecodeError> {
        let micros = match self.take(field)? {
            Value::TimestampMicros(n) | Value::Long(n) => n,
            other => {
                return Err(
                    self.mismatch(field, format!("expected timestamp-micros, found {other:?}"))
                );
            }
        };
        DateTime::from_timestamp_micros(micros)
            .ok_or_else(|| self.mismatch(field, format!("{micros} is out of range")))
    }

    fn json(&mut self, field: &str) -> Result<serde_json::Value, DecodeError> {
        let text = self.string(field)?;
        serde_json::from_str(&text).map_err(|e| self.mismatch(field, format!("not JSON: {e}")))
    }
}
