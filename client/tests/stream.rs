//! `EventStream` against Apache Kafka and the registry, reading events
//! written into a topic of the test's own: repeats and a late duplicate,
//! a gap, both encodings, a record that is no event, and offsets committed
//! only past what was acknowledged.

#![cfg(feature = "kafka")]

use std::time::Duration;

use chrono::{TimeZone, Utc};
use flotilla_client::{
    Delivery, EventStream, EventStreamOptions, GroupProtocol, StreamError, WorkflowRunEvent,
};
use flotilla_codec::Codec;
use flotilla_contracts::EventHeader;
use flotilla_tests::{KAFKA_TEST_TIMEOUT, bootstrap_servers, create_topic, unique};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

/// The broker and registry as a user of the client describes them.
fn broker() -> flotilla_client::BrokerConfig {
    let mut broker = flotilla_client::BrokerConfig::new(&bootstrap_servers());
    broker.registry =
        flotilla_runtime::registry::RegistryConfig::new(&flotilla_tests::schema_registry_url());
    broker
}

fn header(job_id: Uuid, sequence: i64) -> EventHeader {
    EventHeader {
        event_id: Uuid::new_v4(),
        job_id,
        sequence,
        workflow_name: "shipping".to_owned(),
        attempt: 1,
        occurred_at: Utc.with_ymd_and_hms(2026, 12, 4, 21, 0, 0).unwrap()
            + chrono::TimeDelta::microseconds(sequence * 1_000_001),
    }
}

fn checkpoint(job_id: Uuid, sequence: i64) -> WorkflowRunEvent {
    WorkflowRunEvent::step_checkpoint(header(job_id, sequence), format!("step-{sequence}"), None)
        .unwrap()
}

/// Writes events keyed by job id, as the relay does.
struct Writer {
    topic: String,
    producer: FutureProducer,
}

impl Writer {
    async fn new() -> Self {
        Self::with_partitions(3).await
    }

    async fn with_partitions(partitions: i32) -> Self {
        let topic = unique("client-stream");
        create_topic(&topic, partitions).await.unwrap();
        let producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers())
            .set("partitioner", "consistent_random")
            .create()
            .unwrap();
        Self { topic, producer }
    }

    async fn raw(&self, key: &str, payload: &[u8]) {
        self.producer
            .send(
                FutureRecord::to(&self.topic).key(key).payload(payload),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }

    async fn write(&self, codec: &Codec, events: &[&WorkflowRunEvent]) {
        for event in events {
            let payload = codec.encode(&self.topic, *event).await.unwrap();
            self.raw(&event.job_id().to_string(), &payload).await;
        }
    }

    fn stream(&self, group: &str) -> EventStream {
        self.stream_as(group, GroupProtocol::Classic)
    }

    fn stream_as(&self, group: &str, protocol: GroupProtocol) -> EventStream {
        self.stream_through(group, &broker(), protocol)
    }

    fn stream_through(
        &self,
        group: &str,
        broker: &flotilla_client::BrokerConfig,
        protocol: GroupProtocol,
    ) -> EventStream {
        let options = EventStreamOptions::new(group)
            .topic(&self.topic)
            .group_protocol(protocol);
        EventStream::subscribe(broker, &options).unwrap()
    }
}

/// Reads `count` events (gaps and undecodable records put aside),
/// acknowledging each unless `ack` is false.
async fn read(
    stream: &mut EventStream,
    count: usize,
    ack: bool,
) -> (Vec<Delivery>, Vec<StreamError>) {
    let (mut got, mut reported) = (Vec::new(), Vec::new());
    while got.len() < count {
        let delivery = match stream.next().await {
            Ok(delivery) => delivery,
            Err(StreamError::Gap {
                job_id,
                expected,
                got,
                delivery,
            }) => {
                let event = (*delivery).clone();
                reported.push(StreamError::Gap {
                    job_id,
                    expected,
                    got,
                    delivery,
                });
                event
            }
            Err(StreamError::Unavailable(e)) => {
                eprintln!("unavailable: {e}");
                continue;
            }
            Err(e) => {
                reported.push(e);
                continue;
            }
        };
        if ack {
            stream.ack(&delivery);
        }
        got.push(delivery);
    }
    (got, reported)
}

/// Nothing more arrives within `wait` (a repeat dropped, not delayed).
async fn nothing_more(stream: &mut EventStream, wait: Duration) {
    if let Ok(next) = tokio::time::timeout(wait, stream.next()).await {
        panic!("expected nothing more, got {next:?}");
    }
}

#[tokio::test]
async fn repeats_and_a_late_duplicate_are_dropped_and_each_event_comes_once_in_order() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let writer = Writer::new().await;
        let codec = Codec::with_registry(&flotilla_tests::schema_registry_url()).unwrap();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let [a1, a2, a3, a4] = [1, 2, 3, 4].map(|n| checkpoint(a, n));
        let [b1, b2] = [1, 2].map(|n| checkpoint(b, n));
        // a2 straight after itself and again after a3; b1 again at the end.
        writer
            .write(&codec, &[&a1, &a2, &a2, &b1, &a3, &a2, &b2, &a4, &b1])
            .await;
        let mut stream = writer.stream(&unique("g"));
        let (got, reported) = read(&mut stream, 6, true).await;
        assert!(reported.is_empty(), "{reported:?}");
        let of = |job: Uuid| -> Vec<WorkflowRunEvent> {
            got.iter()
                .filter(|d| d.event().job_id() == job)
                .map(|d| d.event().clone())
                .collect()
        };
        assert_eq!(of(a), [a1, a2, a3, a4]);
        assert_eq!(of(b), [b1, b2]);
        nothing_more(&mut stream, Duration::from_secs(2)).await;
        assert_eq!(stream.repeats_dropped(), 3);
        assert_eq!(stream.outstanding(), 0);
    })
    .await
    .expect("the test timed out");
}

#[tokio::test]
async fn a_skipped_sequence_is_reported_with_the_event_that_came() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let writer = Writer::new().await;
        let job = Uuid::new_v4();
        let events = [1, 2, 5, 6].map(|n| checkpoint(job, n));
        writer
            .write(&Codec::json(), &events.iter().collect::<Vec<_>>())
            .await;
        let mut stream = writer.stream(&unique("g"));
        let mut sequences = Vec::new();
        let mut gaps = Vec::new();
        while sequences.len() < 4 {
            match stream.next().await {
                Ok(delivery) => {
                    sequences.push(delivery.event().sequence());
                    stream.ack(&delivery);
                }
                Err(StreamError::Gap {
                    job_id,
                    expected,
                    got,
                    delivery,
                }) => {
                    assert_eq!(job_id, job);
                    gaps.push((expected, got));
                    sequences.push(delivery.event().sequence());
                    stream.ack(&delivery);
                }
                Err(StreamError::Unavailable(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(sequences, [1, 2, 5, 6]);
        assert_eq!(gaps, [(3, 5)]);
    })
    .await
    .expect("the test timed out");
}

#[tokio::test]
async fn an_avro_and_a_json_event_decode_to_the_same_typed_value() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        // A topic per encoding: on one topic the second copy is a repeat.
        let (avro, json) = (Writer::new().await, Writer::new().await);
        let job = Uuid::new_v4();
        let done = WorkflowRunEvent::completed(
            header(job, 3),
            "shipped",
            serde_json::json!({"parcels": 2, "carrier": "post", "note": null}),
        )
        .unwrap();
        let registry = Codec::with_registry(&flotilla_tests::schema_registry_url()).unwrap();
        avro.write(&registry, &[&done]).await;
        json.write(&Codec::json(), &[&done]).await;
        let mut decoded = Vec::new();
        for writer in [&avro, &json] {
            let mut stream = writer.stream(&unique("g"));
            let (got, reported) = read(&mut stream, 1, true).await;
            assert!(reported.is_empty(), "{reported:?}");
            decoded.push(got[0].event().clone());
        }
        assert_eq!(decoded[0], done);
        assert_eq!(decoded[1], done);
    })
    .await
    .expect("the test timed out");
}

#[tokio::test]
async fn a_record_that_is_no_event_is_reported_and_does_not_stall_its_partition() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let writer = Writer::new().await;
        let job = Uuid::new_v4();
        let key = job.to_string();
        writer.write(&Codec::json(), &[&checkpoint(job, 1)]).await;
        writer.raw(&key, br#"{"job_id": "not a uuid"}"#).await;
        // Avro framing naming a schema id the registry does not have.
        writer.raw(&key, b"\x00\x7f\xff\xff\x01garbage").await;
        writer.write(&Codec::json(), &[&checkpoint(job, 2)]).await;
        let mut stream = writer.stream(&unique("g"));
        let (got, reported) = read(&mut stream, 2, true).await;
        let sequences: Vec<i64> = got.iter().map(|d| d.event().sequence()).collect();
        assert_eq!(sequences, [1, 2]);
        assert_eq!(reported.len(), 2, "{reported:?}");
        assert!(
            reported
                .iter()
                .all(|e| matches!(e, StreamError::Undecodable { .. })),
            "{reported:?}"
        );
        assert_eq!(stream.outstanding(), 0);
    })
    .await
    .expect("the test timed out");
}

#[tokio::test]
async fn only_acknowledged_events_are_committed_and_the_rest_come_again_to_the_next_member() {
    acknowledged_only(GroupProtocol::Classic).await;
}

/// The same with both members in a group of the consumer protocol (KIP-848).
#[tokio::test]
async fn only_acknowledged_events_are_committed_under_the_consumer_protocol() {
    acknowledged_only(GroupProtocol::Consumer).await;
}

async fn acknowledged_only(protocol: GroupProtocol) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let writer = Writer::new().await;
        // One job: one partition, so the order of the acknowledgements
        // against the offsets is the test's to choose.
        let job = Uuid::new_v4();
        let events: Vec<WorkflowRunEvent> = (1..=5).map(|n| checkpoint(job, n)).collect();
        writer
            .write(&Codec::json(), &events.iter().collect::<Vec<_>>())
            .await;
        let group = unique("g");
        let mut first = writer.stream_as(&group, protocol);
        let (got, _) = read(&mut first, 5, false).await;
        // 1, 2 and 4 done; 3 and 5 not: only 1 and 2 may be committed.
        for delivery in [&got[0], &got[1], &got[3]] {
            first.ack(delivery);
        }
        assert_eq!(first.outstanding(), 2);
        first.commit().await.unwrap();
        drop(first);

        let mut second = writer.stream_as(&group, protocol);
        let (again, _) = tokio::time::timeout(Duration::from_secs(30), read(&mut second, 3, true))
            .await
            .expect("the unacknowledged events never came again: they were committed");
        let sequences: Vec<i64> = again.iter().map(|d| d.event().sequence()).collect();
        assert_eq!(
            sequences,
            [3, 4, 5],
            "read again from the first one not acknowledged"
        );
        nothing_more(&mut second, Duration::from_secs(2)).await;
    })
    .await
    .expect("the test timed out");
}

#[tokio::test]
async fn an_avro_record_read_without_a_registry_is_a_settings_error_and_is_not_committed() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let writer = Writer::new().await;
        let registry = Codec::with_registry(&flotilla_tests::schema_registry_url()).unwrap();
        let event = checkpoint(Uuid::new_v4(), 1);
        writer.write(&registry, &[&event]).await;
        let group = unique("g");
        let no_registry = flotilla_client::BrokerConfig::new(&bootstrap_servers());
        let mut blind = writer.stream_through(&group, &no_registry, GroupProtocol::Classic);
        for _ in 0..2 {
            let error = blind.next().await.unwrap_err();
            assert!(matches!(error, StreamError::Settings(_)), "{error}");
            assert_eq!(
                blind.outstanding(),
                1,
                "the record stays in hand, unsettled"
            );
        }
        blind.close().await.unwrap();
        // The same group with the registry: the record was not committed.
        let mut seeing = writer.stream(&group);
        let (got, reported) = read(&mut seeing, 1, true).await;
        assert!(reported.is_empty(), "{reported:?}");
        assert_eq!(got[0].event(), &event);
    })
    .await
    .expect("the test timed out");
}

#[tokio::test]
async fn a_registry_outage_holds_the_record_and_the_next_call_decodes_it() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let writer = Writer::new().await;
        let registry = Codec::with_registry(&flotilla_tests::schema_registry_url()).unwrap();
        let event = checkpoint(Uuid::new_v4(), 1);
        writer.write(&registry, &[&event]).await;
        // A registry that fails twice, then knows the schema.
        let schema = serde_json::json!({
            "schema": <WorkflowRunEvent as flotilla_contracts::Message>::schema_text()
        })
        .to_string();
        let stub = flotilla_tests::registry_stub::RegistryStub::start(vec![
            (500, r#"{"error_code":50001,"message":"down"}"#.to_owned()),
            (503, "{}".to_owned()),
            (200, schema),
        ])
        .await;
        let mut through_stub = flotilla_client::BrokerConfig::new(&bootstrap_servers());
        through_stub.registry = flotilla_runtime::registry::RegistryConfig::new(&stub.url());
        let mut stream = writer.stream_through(&unique("g"), &through_stub, GroupProtocol::Classic);
        let mut outages = 0;
        let delivery = loop {
            match stream.next().await {
                Ok(delivery) => break delivery,
                Err(StreamError::Unavailable(_)) => {
                    outages += 1;
                    assert_eq!(stream.outstanding(), 1, "the record stays in hand");
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert!(outages >= 1, "the stub's failures were seen");
        assert_eq!(delivery.event(), &event);
    })
    .await
    .expect("the test timed out");
}

/// A member that keeps an event unacknowledged through a rebalance sees it
/// again, from whichever member holds its partition: the event is never
/// taken for a repeat of itself and committed unseen. Both members are
/// read in one `select!`, which also drops the losing `next()` each time
/// (the stream is cancel-safe).
/// (Classic protocol, librdkafka's eager assignors: a joining member takes
/// every partition away for a moment. Under the consumer protocol a lone
/// partition stays with its member when another joins.)
#[tokio::test]
async fn an_event_unacknowledged_through_a_rebalance_is_delivered_again() {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("client-rebalance");
        flotilla_tests::create_topic(&topic, 1).await.unwrap();
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", flotilla_tests::bootstrap_servers())
            .create()
            .unwrap();
        let job = Uuid::new_v4();
        for sequence in 1..=3 {
            let payload = Codec::json().encode(&topic, &checkpoint(job, sequence)).await.unwrap();
            producer
                .send(FutureRecord::to(&topic).key(&job.to_string()).payload(&payload), Duration::from_secs(10))
                .await
                .map_err(|(e, _)| e)
                .unwrap();
        }
        let broker = broker();
        let group = unique("g");
        let member = || {
            let options = EventStreamOptions::new(&group).topic(&topic);
            EventStream::subscribe(&broker, &options).unwrap()
        };
        let mut first = member();
        let (got, _) = read(&mut first, 3, false).await;
        first.ack(&got[0]);
        first.ack(&got[1]);
        first.commit().await.unwrap();

        // A second member joins (a rebalance), then leaves (another): the
        // first member ends up holding the partition again.
        let mut second = member();
        let third = |d: &Delivery| d.event().sequence() == 3;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
        loop {
            tokio::select! {
                next = first.next() => {
                    if let Ok(d) = next && third(&d) { break; }
                }
                next = second.next() => {
                    if let Ok(d) = next && third(&d) { break; }
                }
                () = tokio::time::sleep_until(deadline) => {
                    panic!("after the rebalance neither member read the unacknowledged event again");
                }
            }
        }
        second.close().await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(40), async {
            loop {
                if let Ok(d) = first.next().await
                    && third(&d)
                {
                    return d;
                }
            }
        })
        .await
        .expect("after the second member left, the first never read the unacknowledged event again");
        assert_eq!(next.event(), &got[2].event().clone());
        drop(first);
    })
    .await
    .expect("the test timed out");
}
