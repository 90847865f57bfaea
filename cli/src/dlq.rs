//! `flotilla dlq list|show|replay`: the request topic's dead letters
//! (`<topic>.dlq`): why each record was refused, and a corrected request
//! produced again under its job id.
//!
//! A letter is named by its place on the dead-letter topic,
//! `PARTITION:OFFSET`. Reading takes no consumer group and commits nothing:
//! the topic is read from its start to its end as it was when asked.
//! Replaying takes the original's job id, workflow and input where they can
//! be read (JSON, or Avro the registry knows), each overridable by a flag,
//! and submits them through the client library: the job id keeps it
//! idempotent, so a letter replayed twice is one job.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use clap::{Args, Subcommand};
use flotilla_client::Submission;
use flotilla_codec::Codec;
use flotilla_contracts::{WorkflowRunRequest, topics};
use flotilla_runtime::BrokerConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::Failure;

/// How long the broker may take to show the topic or hand a record over.
const BROKER_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Args)]
pub(crate) struct DlqArgs {
    #[command(subcommand)]
    command: DlqCommand,
    #[command(flatten)]
    kafka: BrokerConfig,
    /// The request topic whose dead letters these are (`<topic>.dlq`).
    #[arg(long, env = "FLOTILLA_REQUEST_TOPIC", default_value = topics::REQUEST_TOPIC, global = true)]
    topic: String,
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// Every dead letter, oldest first per partition: where it is, why it
    /// was refused and its key.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// One dead letter whole: the reason, where it came from, its headers,
    /// and its value (decoded where it can be).
    Show {
        /// `PARTITION:OFFSET` on the dead-letter topic (from `list`).
        letter: String,
    },
    /// Produce the letter's request again to the request topic, corrected
    /// by the flags, under its job id (the same letter twice is one job).
    Replay {
        /// `PARTITION:OFFSET` on the dead-letter topic (from `list`).
        letter: String,
        /// The workflow to run, instead of the original's.
        #[arg(long)]
        workflow: Option<String>,
        /// The input, instead of the original's: JSON text, or @path.
        #[arg(long)]
        input: Option<String>,
        /// The job id, instead of the original's (its key when it has no other).
        #[arg(long)]
        job_id: Option<Uuid>,
        /// Force JSON even when a registry is configured.
        #[arg(long)]
        json: bool,
    },
}

/// One record of the dead-letter topic.
struct Letter {
    partition: i32,
    offset: i64,
    key: Option<String>,
    value: Option<Vec<u8>>,
    headers: BTreeMap<String, String>,
}

impl Letter {
    fn place(&self) -> String {
        format!("{}:{}", self.partition, self.offset)
    }

    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }

    fn summary(&self) -> Value {
        json!({
            "letter": self.place(),
            "code": self.header("flotilla.dlq.code"),
            "reason": self.header("flotilla.dlq.reason"),
            "key": self.key,
            "source": format!("{}/{}:{}", self.header("flotilla.dlq.source.topic"),
                self.header("flotilla.dlq.source.partition"), self.header("flotilla.dlq.source.offset")),
            "value_bytes": self.value.as_ref().map_or(0, Vec::len),
        })
    }
}

pub(crate) async fn run(args: DlqArgs) -> Result<(), Failure> {
    let dead_letters = topics::dead_letter_topic(&args.topic);
    match args.command {
        DlqCommand::List { json } => {
            let letters = read(&args.kafka, &dead_letters, None).await?;
            for letter in &letters {
                let summary = letter.summary();
                if json {
                    println!("{summary}");
                } else {
                    println!(
                        "{:<10} {:<22} {:<38} {}",
                        letter.place(),
                        summary["code"].as_str().unwrap_or_default(),
                        letter.key.as_deref().unwrap_or("-"),
                        summary["reason"].as_str().unwrap_or_default()
                    );
                }
            }
            eprintln!("{} dead letter(s) on {dead_letters}", letters.len());
            Ok(())
        }
        DlqCommand::Show { letter } => {
            let letter = one(&args.kafka, &dead_letters, &letter).await?;
            let original = Original::read(&args.kafka, &letter).await;
            let mut shown = letter.summary();
            shown["headers"] = json!(letter.headers);
            shown["value"] = original.shown;
            println!(
                "{}",
                serde_json::to_string_pretty(&shown).unwrap_or_default()
            );
            Ok(())
        }
        DlqCommand::Replay {
            letter,
            workflow,
            input,
            job_id,
            json,
        } => {
            let letter = one(&args.kafka, &dead_letters, &letter).await?;
            let original = Original::read(&args.kafka, &letter).await;
            let input = match input {
                Some(text) => Some(crate::jobs::json_arg(&text, "--input")?),
                None => original.input,
            };
            let job_id = job_id
                .or(original.job_id)
                .or_else(|| letter.key.as_deref().and_then(|k| Uuid::parse_str(k).ok()));
            // A version belongs to the original's workflow, not another.
            let workflow_version = original.workflow_version.filter(|_| workflow.is_none());
            let (Some(workflow), Some(input), Some(job_id)) =
                (workflow.or(original.workflow_name), input, job_id)
            else {
                return Err(Failure::usage(anyhow!(
                    "letter {} has no readable workflow, input or job id: give --workflow, --input and --job-id",
                    letter.place()
                )));
            };
            let mut submission = Submission::new(&workflow, &input)
                .map_err(crate::produce::failure)?
                .with_job_id(job_id);
            if let Some(version) = workflow_version {
                submission = submission.with_workflow_version(version);
            }
            if let Some(priority) = original.priority {
                submission = submission.with_priority(priority);
            }
            let receipt = crate::produce::submitter(&args.kafka, json)?
                .with_request_topic(&args.topic)
                .submit(&submission)
                .await
                .map_err(crate::produce::failure)?;
            println!("{}", receipt.job_id());
            eprintln!(
                "replayed dead letter {} as job {job_id} of {workflow} to {}",
                letter.place(),
                args.topic
            );
            Ok(())
        }
    }
}

/// The letter at `PARTITION:OFFSET`.
async fn one(kafka: &BrokerConfig, topic: &str, place: &str) -> Result<Letter, Failure> {
    let parsed = place
        .split_once(':')
        .and_then(|(p, o)| Some((p.parse::<i32>().ok()?, o.parse::<i64>().ok()?)));
    let Some((partition, offset)) = parsed else {
        return Err(Failure::usage(anyhow!(
            "a letter is PARTITION:OFFSET (as `flotilla dlq list` prints it), not {place:?}"
        )));
    };
    read(kafka, topic, Some((partition, offset)))
        .await?
        .into_iter()
        .find(|l| l.offset == offset)
        .ok_or_else(|| Failure::not_found(anyhow!("no dead letter at {place} on {topic}")))
}

/// Every record of `topic` from its start to its end as it is now, or the
/// one at `only` (a partition and an offset).
async fn read(
    kafka: &BrokerConfig,
    topic: &str,
    only: Option<(i32, i64)>,
) -> Result<Vec<Letter>, Failure> {
    let consumer: BaseConsumer = kafka
        .manual_commit_consumer(&format!("flotilla-cli-dlq-{}", Uuid::new_v4()))
        .create()
        .context("creating the Kafka consumer")
        .map_err(Failure::usage)?;
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || read_blocking(&consumer, &topic, only))
        .await
        .map_err(|e| Failure::delivery(anyhow!("reading dead letters: {e}")))?
}

fn read_blocking(
    consumer: &BaseConsumer,
    topic: &str,
    only: Option<(i32, i64)>,
) -> Result<Vec<Letter>, Failure> {
    let world = |e: rdkafka::error::KafkaError| Failure::delivery(anyhow!("{topic}: {e}"));
    let metadata = consumer
        .fetch_metadata(Some(topic), BROKER_WAIT)
        .map_err(world)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .filter(|p| only.is_none_or(|(wanted, _)| wanted == *p))
        .collect();
    if partitions.is_empty() {
        return Err(Failure::not_found(anyhow!(
            "the broker shows no {topic}{}",
            only.map(|(p, _)| format!(" partition {p}"))
                .unwrap_or_default()
        )));
    }
    // Where each partition's reading starts and the offset it stops before.
    let mut bounds = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for partition in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, BROKER_WAIT)
            .map_err(world)?;
        let (start, end) = match only {
            Some((_, offset)) if offset < low || offset >= high => continue,
            Some((_, offset)) => (offset, offset + 1),
            None => (low, high),
        };
        if start < end {
            bounds.insert(partition, end);
            assignment
                .add_partition_offset(topic, partition, Offset::Offset(start))
                .map_err(world)?;
        }
    }
    if bounds.is_empty() {
        return Ok(Vec::new());
    }
    consumer.assign(&assignment).map_err(world)?;
    let mut letters = Vec::new();
    let deadline = std::time::Instant::now() + BROKER_WAIT;
    while !bounds.is_empty() {
        if std::time::Instant::now() > deadline {
            return Err(Failure::delivery(anyhow!(
                "{topic}: the broker did not hand over every dead letter within {} s",
                BROKER_WAIT.as_secs()
            )));
        }
        let Some(received) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = received.map_err(world)?;
        let (partition, offset) = (message.partition(), message.offset());
        let Some(&end) = bounds.get(&partition) else {
            continue;
        };
        if offset + 1 >= end {
            bounds.remove(&partition);
        }
        if offset >= end {
            continue;
        }
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| {
                        let value = h.value.map(String::from_utf8_lossy).unwrap_or_default();
                        (h.key.to_owned(), value.into_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        letters.push(Letter {
            partition,
            offset,
            key: message
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
            value: message.payload().map(<[u8]>::to_vec),
            headers,
        });
    }
    letters.sort_by_key(|l| (l.partition, l.offset));
    Ok(letters)
}

/// What can be read of a letter's original request.
struct Original {
    job_id: Option<Uuid>,
    workflow_name: Option<String>,
    input: Option<Value>,
    workflow_version: Option<i32>,
    priority: Option<i32>,
    /// The value as `show` prints it.
    shown: Value,
}

impl Original {
    /// The value read as JSON (field by field, however malformed the rest),
    /// or as an Avro request the registry knows; else its bytes described.
    async fn read(kafka: &BrokerConfig, letter: &Letter) -> Self {
        let none = |shown: Value| Self {
            job_id: None,
            workflow_name: None,
            input: None,
            workflow_version: None,
            priority: None,
            shown,
        };
        let Some(value) = letter.value.as_deref() else {
            return none(json!(format!(
                "(not kept: {} bytes)",
                letter.header("flotilla.dlq.value-dropped-bytes")
            )));
        };
        if let Ok(document) = serde_json::from_slice::<Value>(value) {
            return Self {
                job_id: document["job_id"]
                    .as_str()
                    .and_then(|id| Uuid::parse_str(id).ok()),
                workflow_name: document["workflow_name"].as_str().map(str::to_owned),
                input: document.get("input").cloned(),
                workflow_version: int_field(&document, "workflow_version"),
                priority: int_field(&document, "priority"),
                shown: document,
            };
        }
        if let Ok(codec) = Codec::from_config(&kafka.registry)
            && let Ok(request) = codec.decode::<WorkflowRunRequest>(value).await
        {
            return Self {
                job_id: Some(request.job_id()),
                workflow_name: Some(request.workflow_name().to_owned()),
                input: Some(request.input().clone()),
                workflow_version: request.workflow_version(),
                priority: request.priority(),
                shown: json!({"job_id": request.job_id(), "workflow_name": request.workflow_name(),
                    "input": request.input(), "workflow_version": request.workflow_version(),
                    "priority": request.priority()}),
            };
        }
        let preview: String = String::from_utf8_lossy(&value[..value.len().min(200)]).into_owned();
        none(json!(format!(
            "({} bytes, not a readable request) {preview:?}",
            value.len()
        )))
    }
}

/// An integer field of a JSON request that fits its type, if any.
fn int_field(document: &Value, name: &str) -> Option<i32> {
    document[name].as_i64().and_then(|n| i32::try_from(n).ok())
}
