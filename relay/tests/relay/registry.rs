//! A schema registry that fails is an outage: the relay's rows wait PENDING
//! without failing any, nothing reaches the topic, and they are
//! published, in order, once the registry answers again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use flotilla_contracts::Message as _;
use flotilla_relay::publisher::{Class, Reason};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// The schema id the healed registry gives the event schema.
const SCHEMA_ID: u32 = 42;

/// A registry that answers 500 to everything until healed; then it
/// registers any schema as [`SCHEMA_ID`] and serves the event schema for
/// that id. One connection per request, so every request is counted.
struct FlakyRegistry {
    address: SocketAddr,
    healthy: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
}

impl FlakyRegistry {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let healthy = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let (serving, counting) = (healthy.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer(stream, serving.clone(), counting.clone()));
            }
        });
        Self {
            address,
            healthy,
            requests,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    fn heal(&self) {
        self.healthy.store(true, Ordering::SeqCst);
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Reads one request (its head, then the body its length announces) and
/// answers it.
async fn answer(mut stream: TcpStream, healthy: Arc<AtomicBool>, requests: Arc<AtomicUsize>) {
    let mut request = Vec::new();
    let mut chunk = [0u8; 4096];
    let body_start = loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&chunk[..n]),
        }
        if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&request[..body_start]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    while request.len() < body_start + length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&chunk[..n]),
        }
    }
    requests.fetch_add(1, Ordering::SeqCst);
    let (status, body) = if !healthy.load(Ordering::SeqCst) {
        (
            500,
            r#"{"error_code": 50001, "message": "backing store unavailable"}"#.to_owned(),
        )
    } else if head.starts_with("post ") {
        (200, json!({ "id": SCHEMA_ID }).to_string())
    } else {
        (
            200,
            json!({ "schema": WorkflowRunEvent::schema_text() }).to_string(),
        )
    };
    let response = format!(
        "HTTP/1.1 {status} Flaky\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Rows waiting to be published, none of them FAILED.
async fn untouched(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM workflow_run_outbox_state
         WHERE status = 'PENDING' AND last_error IS NULL",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn rows_wait_without_failing_while_the_registry_fails_then_publish_in_order(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        flotilla_tests::create_topic(&topic, 3).await.unwrap();
        let bootstrap = flotilla_tests::bootstrap_servers();
        let registry = FlakyRegistry::start().await;
        let jobs: Vec<Uuid> = (0..8).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 3, json!({})).await;
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
        let mut relay_settings = settings(&bootstrap, &topic, "registry-outage");
        relay_settings.broker.registry =
            flotilla_runtime::registry::RegistryConfig::new(&registry.url());
        let relay = Relay::new(pool.clone(), clock.clone(), relay_settings).unwrap();

        // One pass at a time while the registry answers 500: each bucket's
        // batch is held back by the world at its first row, each pass, and
        // nothing is written.
        let buckets: i64 =
            sqlx::query_scalar("SELECT count(DISTINCT bucket) FROM workflow_run_outbox")
                .fetch_one(&pool)
                .await
                .unwrap();
        let buckets = usize::try_from(buckets).unwrap();
        for pass in 1..=3 {
            let asked = registry.requests();
            let report = relay.drain_once().await.unwrap();
            assert_eq!(
                (report.published, report.failed, report.deferred),
                (0, 0, buckets),
                "pass {pass}: {report:?}"
            );
            assert_eq!(
                report.misses,
                BTreeMap::from([((Class::World, Reason::Registry), buckets)]),
                "pass {pass}"
            );
            assert!(
                registry.requests() >= asked + buckets,
                "pass {pass}: the registry was asked again for each batch"
            );
            assert_eq!(
                untouched(&pool).await,
                24,
                "pass {pass}: none failed, no error recorded"
            );
            clock.advance(Duration::from_secs(3600));
        }
        assert_eq!(
            copies_on_topic(&bootstrap, &topic, 3),
            0,
            "nothing reached the topic"
        );

        // The streaming loop meets the outage too, pauses and asks again.
        let stop = CancellationToken::new();
        let running = {
            let (relay, stop) = (relay.clone(), stop.clone());
            tokio::spawn(async move { relay.run(stop, Duration::from_secs(5)).await })
        };
        let asked = registry.requests();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while registry.requests() < asked + 16 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the running relay stopped asking the registry"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            untouched(&pool).await,
            24,
            "still nothing spent while it streams"
        );

        registry.heal();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while count(&pool, "PUBLISHED").await < 24 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "rows did not publish once the registry answered"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        running.await.unwrap();
        assert_eq!(count(&pool, "FAILED").await, 0, "the outage failed no row");

        // Every event once, Avro framed with the registry's id, in order per job.
        assert_eq!(copies_on_topic(&bootstrap, &topic, 3), 24);
        let codec = flotilla_codec::Codec::with_registry(&registry.url()).unwrap();
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", unique("avro-reader"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        consumer.subscribe(&[&topic]).unwrap();
        let mut by_job: BTreeMap<Uuid, Vec<i64>> = BTreeMap::new();
        for _ in 0..24 {
            let message = consumer.recv().await.unwrap();
            let payload = message.payload().unwrap();
            assert_eq!(payload[0], 0, "Confluent framing");
            assert_eq!(
                u32::from_be_bytes(payload[1..5].try_into().unwrap()),
                SCHEMA_ID
            );
            let event = codec.decode::<WorkflowRunEvent>(payload).await.unwrap();
            assert_eq!(
                event.workflow_version(),
                Some(3),
                "the version travels in Avro"
            );
            by_job
                .entry(event.job_id())
                .or_default()
                .push(event.sequence());
        }
        close_consumer(consumer);
        assert_eq!(by_job.len(), 8);
        for (job, sequences) in by_job {
            assert_eq!(sequences, [1, 2, 3], "job {job}");
        }
        drop(relay);
    })
    .await
    .expect("timed out");
}

/// A registry that refuses the event schema (409: incompatible with the
/// subject's history; 422: not valid there) is an outage of the relay for
/// an operator to fix, not a fault of the events: they wait PENDING,
/// however many passes it lasts, instead of landing FAILED.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_registry_refusing_the_event_schema_holds_rows_back_without_failing_them(pool: PgPool) {
    use flotilla_tests::registry_stub::RegistryStub;
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("events");
        flotilla_tests::create_topic(&topic, 3).await.unwrap();
        let jobs: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 1, json!({})).await;
        for answer in [
            (
                409,
                r#"{"error_code": 409, "message": "incompatible schema"}"#,
            ),
            (422, r#"{"error_code": 42201, "message": "invalid schema"}"#),
        ] {
            let stub = RegistryStub::start(vec![(answer.0, answer.1.to_owned())]).await;
            let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
            let mut relay_settings = settings(
                &flotilla_tests::bootstrap_servers(),
                &topic,
                "refused-schema",
            );
            relay_settings.broker.registry =
                flotilla_runtime::registry::RegistryConfig::new(&stub.url());
            let relay = Relay::new(pool.clone(), clock.clone(), relay_settings).unwrap();
            for pass in 1..=12 {
                let report = relay.drain_once().await.unwrap();
                assert_eq!(
                    (report.published, report.failed, report.deferred),
                    (0, 0, 4),
                    "{}: pass {pass}: {report:?}",
                    answer.0
                );
                clock.advance(Duration::from_secs(3600));
            }
            assert_eq!(untouched(&pool).await, 4, "{}: none FAILED", answer.0);
            drop(relay);
        }
    })
    .await
    .expect("timed out");
}
