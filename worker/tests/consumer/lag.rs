//! The consumer lag the fleet view shows, read from the real broker: the
//! group's committed offsets against each partition's high watermark.

use std::time::Duration;

use flotilla_runtime::kafka::lag::{self, LagReader, LagSource, PartitionLag};
use flotilla_tests::{bootstrap_servers, broker, create_topic, unique};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::within_deadline;

#[tokio::test]
async fn lag_is_the_distance_from_the_groups_commit_to_the_high_watermark() {
    within_deadline(async {
        let (topic, group) = (unique("lag"), unique("lag-group"));
        create_topic(&topic, 2).await.unwrap();
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers())
            .create()
            .unwrap();
        for (partition, count) in [(0, 5), (1, 3)] {
            for n in 0..count {
                let value = format!("{n}");
                let record = FutureRecord::<(), _>::to(&topic)
                    .partition(partition)
                    .payload(&value);
                producer
                    .send(record, Duration::from_secs(10))
                    .await
                    .unwrap();
            }
        }
        // The group has committed 2 on partition 0 and nothing on 1.
        let committer: BaseConsumer = flotilla_tests::manual_commit_consumer_config(&group)
            .create()
            .unwrap();
        let mut committed = TopicPartitionList::new();
        committed
            .add_partition_offset(&topic, 0, Offset::Offset(2))
            .unwrap();
        committer.commit(&committed, CommitMode::Sync).unwrap();
        std::thread::spawn(move || drop(committer));

        let source = LagSource {
            broker: broker(),
            group,
            topic,
        };
        let lags = lag::read(&source, Duration::from_secs(10)).await.unwrap();
        // A flood of fleet views: one client, the same answer.
        let reader = LagReader::new(source);
        let views =
            futures_util::future::join_all((0..20).map(|_| reader.read(Duration::from_secs(10))))
                .await;
        assert!(
            views.iter().all(|view| view.as_ref() == Ok(&lags)),
            "{views:?}"
        );
        assert_eq!(reader.clients_created(), 1);
        assert_eq!(
            lags,
            [
                PartitionLag {
                    partition: 0,
                    committed: Some(2),
                    high_watermark: 5,
                    lag: 3
                },
                PartitionLag {
                    partition: 1,
                    committed: None,
                    high_watermark: 3,
                    lag: 3
                },
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn a_broker_that_does_not_answer_is_an_error_within_the_timeout() {
    within_deadline(async {
        let source = LagSource {
            broker: flotilla_runtime::BrokerConfig::new(&format!(
                "127.0.0.1:{}",
                flotilla_tests::free_port()
            )),
            group: unique("lag-group"),
            topic: unique("lag"),
        };
        let started = std::time::Instant::now();
        let outcome = lag::read(&source, Duration::from_secs(1)).await;
        assert!(outcome.is_err(), "{outcome:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    })
    .await;
}
