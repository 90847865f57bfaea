//! The broker does what Flotilla relies on: keyed idempotent produce over
//! three partitions, a consumer group with manual commits, and a restarted
//! consumer resuming right after the committed offsets.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use flotilla_tests::{
    KAFKA_TEST_TIMEOUT, bootstrap_servers, close_consumer, create_topic,
    manual_commit_consumer_config, unique,
};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const KEYS: usize = 10;
const PER_KEY: usize = 3;
const FIRST_BATCH: usize = 12;

type Position = (i32, i64);

/// Produces `PER_KEY` messages for each of `KEYS` keys; returns where each landed.
async fn produce(topic: &str) -> anyhow::Result<BTreeMap<Position, (String, usize)>> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()?;
    let mut landed = BTreeMap::new();
    for round in 0..PER_KEY {
        for key in 0..KEYS {
            let key = format!("key-{key}");
            let payload = format!("{key}/{round}");
            let record = FutureRecord::to(topic).key(&key).payload(&payload);
            let delivery = producer
                .send(record, Duration::from_secs(10))
                .await
                .map_err(|(e, _)| e)?;
            landed.insert((delivery.partition, delivery.offset), (key, round));
        }
    }
    Ok(landed)
}

/// Receives `count` messages; returns their positions and payloads.
async fn receive(
    consumer: &StreamConsumer,
    count: usize,
) -> anyhow::Result<Vec<(Position, String)>> {
    let mut seen = Vec::with_capacity(count);
    while seen.len() < count {
        let message = consumer.recv().await?;
        let payload = String::from_utf8(message.payload().unwrap_or_default().to_vec())?;
        seen.push(((message.partition(), message.offset()), payload));
    }
    Ok(seen)
}

/// Commits, per partition, the offset after the highest one received.
fn commit(
    consumer: &StreamConsumer,
    topic: &str,
    seen: &[(Position, String)],
) -> anyhow::Result<()> {
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for ((partition, offset), _) in seen {
        let entry = next.entry(*partition).or_default();
        *entry = (*entry).max(offset + 1);
    }
    let mut offsets = TopicPartitionList::new();
    for (partition, offset) in next {
        offsets.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    }
    consumer.commit(&offsets, CommitMode::Sync)?;
    Ok(())
}

async fn resume_after_manual_commit() -> anyhow::Result<()> {
    let topic = unique("smoke");
    let group = unique("smoke-group");
    create_topic(&topic, 3).await?;
    let landed = produce(&topic).await?;
    assert_eq!(
        landed.len(),
        KEYS * PER_KEY,
        "every delivery has its own offset"
    );
    let partitions: BTreeSet<i32> = landed.keys().map(|(p, _)| *p).collect();
    assert!(
        partitions.len() > 1,
        "keys spread over partitions: {partitions:?}"
    );

    // A key always lands in one partition, in produce order.
    let mut key_partition: BTreeMap<&str, i32> = BTreeMap::new();
    for ((partition, _), (key, _)) in &landed {
        assert_eq!(
            *key_partition.entry(key).or_insert(*partition),
            *partition,
            "{key} moved"
        );
    }

    let first: StreamConsumer = manual_commit_consumer_config(&group).create()?;
    first.subscribe(&[&topic])?;
    let first_seen = receive(&first, FIRST_BATCH).await?;
    commit(&first, &topic, &first_seen)?;
    close_consumer(first);

    // What the first consumer committed is exactly a prefix of each partition.
    let committed: BTreeSet<Position> = first_seen.iter().map(|(pos, _)| *pos).collect();
    for (partition, offset) in &committed {
        for earlier in 0..*offset {
            assert!(
                committed.contains(&(*partition, earlier)),
                "gap before {partition}/{offset}"
            );
        }
    }

    let second: StreamConsumer = manual_commit_consumer_config(&group).create()?;
    second.subscribe(&[&topic])?;
    let second_seen = receive(&second, landed.len() - FIRST_BATCH).await?;
    close_consumer(second);

    for (position, payload) in &second_seen {
        assert!(
            !committed.contains(position),
            "{payload} at {position:?} was redelivered after its commit"
        );
        let (key, round) = &landed[position];
        assert_eq!(payload, &format!("{key}/{round}"));
    }
    let all: BTreeSet<Position> = committed
        .iter()
        .copied()
        .chain(second_seen.iter().map(|(pos, _)| *pos))
        .collect();
    assert_eq!(
        all,
        landed.keys().copied().collect(),
        "every message consumed exactly once"
    );
    Ok(())
}

#[tokio::test]
async fn consumer_resumes_after_its_manually_committed_offsets() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, resume_after_manual_commit())
        .await
        .expect("the Kafka smoke test timed out")
        .expect("the Kafka smoke test failed");
}
