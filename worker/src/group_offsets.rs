//! `flotilla-worker offsets set`: moves a consumer group's offsets in Kafka
//! and in the database together. The consumers keep their offsets in both
//! (docs/architecture.md, "Offsets kept with the rows") and, on assignment,
//! go back to the database's where it is behind Kafka's (a failover lost
//! commits): so a group moved forward in Kafka alone
//! (`kafka-consumer-groups --reset-offsets`) is sent back at its next
//! assignment and reads what was skipped again. Like Kafka's tool, this
//! refuses while the group has members: a live member reads on from its own
//! position and commits over the move.

use std::time::Duration;

use anyhow::{Context as _, bail};
use flotilla_runtime::BrokerConfig;
use flotilla_store::consumer_offsets::{self, PartitionOffset};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::SetOffsets;

/// How long one request to the broker may take.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// One partition moved: where the group stood before, and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub partition: i32,
    /// The group's committed offset in Kafka before (none: no commit).
    pub kafka_before: Option<i64>,
    /// The database's offset before (none: no record).
    pub database_before: Option<i64>,
    /// The next offset the group reads now, in both.
    pub now: i64,
}

/// Moves the offsets `args` names: in Kafka first (the broker itself
/// refuses a commit to a group with members), then in the database.
///
/// # Errors
/// The group has members, a partition or offset does not exist, Kafka or
/// the database failed (said which moved).
pub async fn set(args: &SetOffsets) -> anyhow::Result<Vec<Moved>> {
    let pool = flotilla_store::connect(&args.database)
        .await
        .context("connecting to Postgres")?;
    let in_kafka = {
        let args = args.clone();
        tokio::task::spawn_blocking(move || move_in_kafka(&args))
            .await
            .context("the Kafka step stopped")??
    };
    let partitions: Vec<(String, i32)> = in_kafka
        .iter()
        .map(|(partition, _, _)| (args.topic.clone(), *partition))
        .collect();
    let database_before = consumer_offsets::next_offsets(&pool, &args.group, &partitions)
        .await
        .context("reading the database's offsets (Kafka's were moved: run the command again)")?;
    let offsets: Vec<PartitionOffset> = in_kafka
        .iter()
        .map(|(partition, _, now)| PartitionOffset {
            topic: args.topic.clone(),
            partition: *partition,
            next_offset: *now,
        })
        .collect();
    consumer_offsets::set(&pool, &args.group, &offsets)
        .await
        .context("writing the database's offsets (Kafka's were moved: run the command again)")?;
    Ok(in_kafka
        .into_iter()
        .map(|(partition, kafka_before, now)| Moved {
            partition,
            kafka_before,
            database_before: database_before
                .iter()
                .find(|o| o.partition == partition)
                .map(|o| o.next_offset),
            now,
        })
        .collect())
}

/// Refuses a group with members, finds each partition's target and
/// commits them for the group: (partition, committed before, target).
fn move_in_kafka(args: &SetOffsets) -> anyhow::Result<Vec<(i32, Option<i64>, i64)>> {
    let consumer = outside_member(&args.broker, &args.group)?;
    refuse_live_members(&consumer, &args.group)?;
    let mut targets = TopicPartitionList::new();
    for partition in partitions_of(&consumer, &args.topic, args.partition)? {
        let (low, high) = consumer
            .fetch_watermarks(&args.topic, partition, KAFKA_TIMEOUT)
            .with_context(|| format!("reading the offsets of {}/{partition}", args.topic))?;
        let target = match args.to_offset {
            Some(offset) if !(low..=high).contains(&offset) => bail!(
                "offset {offset} is not in {}/{partition}, which holds {low} to {high}",
                args.topic
            ),
            Some(offset) => offset,
            None => high,
        };
        targets.add_partition_offset(&args.topic, partition, Offset::Offset(target))?;
    }
    let before = consumer
        .committed_offsets(targets.clone(), KAFKA_TIMEOUT)
        .context("reading the group's committed offsets")?;
    consumer.commit(&targets, CommitMode::Sync).context(
        "Kafka refused the commit (did a member join the group?); nothing moved in the database",
    )?;
    Ok(targets
        .elements()
        .iter()
        .filter_map(|e| {
            let Offset::Offset(target) = e.offset() else {
                return None;
            };
            let committed = match before.find_partition(e.topic(), e.partition())?.offset() {
                Offset::Offset(offset) => Some(offset),
                _ => None,
            };
            Some((e.partition(), committed, target))
        })
        .collect())
}

/// A client of `group` that never joins it: it commits for the group as
/// Kafka's own tool does, which the broker takes only while the group has
/// no members.
fn outside_member(broker: &BrokerConfig, group: &str) -> anyhow::Result<BaseConsumer> {
    broker
        .manual_commit_consumer(group)
        .create()
        .context("creating the Kafka client")
}

/// Refuses a group that has members now (a classic group's, as the broker
/// describes it; a group of the consumer protocol may not be described so,
/// and then the broker's refusal of the commit is the check).
fn refuse_live_members(consumer: &BaseConsumer, group: &str) -> anyhow::Result<()> {
    let groups = consumer
        .fetch_group_list(Some(group), KAFKA_TIMEOUT)
        .context("describing the group")?;
    let Some(found) = groups.groups().iter().find(|g| g.name() == group) else {
        return Ok(());
    };
    if found.members().is_empty() {
        return Ok(());
    }
    let members: Vec<String> = found
        .members()
        .iter()
        .map(|m| format!("{} ({})", m.client_id(), m.client_host()))
        .collect();
    bail!(
        "group {group} has {} members now ({}): stop every consumer of the group (scale the workers to 0) and run this again; a live member would commit over the move (Kafka's own tool refuses the same)",
        members.len(),
        members.join(", ")
    )
}

/// The partitions of `topic` to move: `only` (which must exist), or all.
fn partitions_of(
    consumer: &BaseConsumer,
    topic: &str,
    only: Option<i32>,
) -> anyhow::Result<Vec<i32>> {
    let metadata = consumer
        .fetch_metadata(Some(topic), KAFKA_TIMEOUT)
        .with_context(|| format!("reading the metadata of {topic}"))?;
    let all: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| {
            t.partitions()
                .iter()
                .map(rdkafka::metadata::MetadataPartition::id)
        })
        .collect();
    if all.is_empty() {
        bail!("the broker lists no partitions of {topic}");
    }
    match only {
        Some(partition) if !all.contains(&partition) => {
            bail!(
                "{topic} has no partition {partition} (it has {})",
                all.len()
            )
        }
        Some(partition) => Ok(vec![partition]),
        None => Ok(all),
    }
}
