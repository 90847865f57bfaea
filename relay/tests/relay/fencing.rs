//! Fenced relays: a relay publishes and marks only rows of buckets it
//! holds, by the database's clock. One that stalls past its lease (SIGSTOP)
//! while another takes over publishes nothing out of order when it wakes.

use std::process::Command;

use flotilla_store::buckets;
use flotilla_tests::process::Running;

use super::*;

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_relay_that_lost_its_buckets_marks_nothing_and_sends_nothing_more(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("fenced");
        create_topic(&topic, 3).await.unwrap();
        let jobs: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &jobs, 2, json!({})).await;
        let clock = Arc::new(ManualClock::new(Utc::now() + chrono::TimeDelta::seconds(1)));
        let stale = Relay::new(pool.clone(), clock.clone(), settings(&bootstrap_servers(), &topic, "stale")).unwrap();
        let batch = stale.publish_once().await.unwrap();
        assert_eq!(batch.acked(), 8, "the whole batch");
        // Its leases run out (it stalled), and another relay takes them.
        sqlx::query("UPDATE relay_bucket SET lease_until = now() - interval '1 second' WHERE owner = 'stale'")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("DELETE FROM relay_member WHERE relay_id = 'stale'")
            .execute(&pool)
            .await
            .unwrap();
        let fresh = Relay::new(pool.clone(), clock.clone(), settings(&bootstrap_servers(), &topic, "fresh")).unwrap();
        assert_eq!(fresh.drain_once().await.unwrap().published, 8);
        let report = batch
            .mark(&pool, "stale", Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(report.published, 0, "the stale relay's marks are fenced off");

        // A renewal finds the buckets gone: nothing more is sent from them.
        let leases = flotilla_relay::buckets::BucketLeases::new(pool.clone(), "stale".into(), Duration::from_secs(10));
        leases.renew().await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let owned: Vec<i16> = sqlx::query_scalar("SELECT bucket FROM relay_bucket WHERE owner = 'fresh'")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        assert!(owned.iter().all(|b| !leases.held().holds(*b)));
        assert_eq!(buckets::BUCKETS, 64);
    })
    .await
    .expect("timed out");
}

fn relay_process(topic: &str, id: &str, database_url: &str) -> Running {
    relay_process_on(&bootstrap_servers(), topic, id, database_url, &[])
}

/// A relay process on `bootstrap` with 2 s bucket leases, and `extra`
/// variables.
fn relay_process_on(
    bootstrap: &str,
    topic: &str,
    id: &str,
    database_url: &str,
    extra: &[(&str, &str)],
) -> Running {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla-relay"));
    command
        .env("DATABASE_URL", database_url)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
        .env("FLOTILLA_EVENT_TOPIC", topic)
        .env("FLOTILLA_RELAY_ID", id)
        .env("FLOTILLA_RELAY_HTTP_ADDR", "127.0.0.1:0")
        .env("SCHEMA_REGISTRY_URL", "")
        .env("FLOTILLA_RELAY_LEASE", "2s")
        .env("FLOTILLA_RELAY_IDLE_POLL_MAX", "50ms")
        .env("NO_COLOR", "1")
        .envs(extra.iter().copied());
    let mut running = Running::start(command);
    running.wait_for_line("relay ready", Duration::from_secs(60));
    running
}

async fn wait_until_none(pool: &PgPool, status: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(pool, status).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rows stayed {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_relay_paused_past_its_lease_and_resumed_publishes_nothing_out_of_order(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("stalled");
        create_topic(&topic, 3).await.unwrap();
        let url = flotilla_tests::database::url_of(&pool).await;

        let first: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &first, 3, json!({})).await;
        let (topic_a, url_a) = (topic.clone(), url.clone());
        let sleeper =
            tokio::task::spawn_blocking(move || relay_process(&topic_a, "sleeper", &url_a))
                .await
                .unwrap();
        wait_until_none(&pool, "PENDING").await;

        sleeper.signal("STOP");
        let second: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &second, 3, json!({})).await;
        let (topic_b, url_b) = (topic.clone(), url.clone());
        let mut heir = tokio::task::spawn_blocking(move || relay_process(&topic_b, "heir", &url_b))
            .await
            .unwrap();
        wait_until_none(&pool, "PENDING").await;

        sleeper.signal("CONT");
        let third: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
        insert_events(&pool, &third, 3, json!({})).await;
        wait_until_none(&pool, "PENDING").await;

        let events = read_events(&bootstrap_servers(), &topic, 180).await;
        let mut seen = std::collections::HashSet::new();
        let mut partition_of: HashMap<Uuid, i32> = HashMap::new();
        let mut streams: BTreeMap<Uuid, Vec<i64>> = BTreeMap::new();
        for (partition, _, event, _) in &events {
            assert_eq!(
                *partition_of.entry(event.job_id()).or_insert(*partition),
                *partition
            );
            if seen.insert(event.event_id()) {
                streams
                    .entry(event.job_id())
                    .or_default()
                    .push(event.sequence());
            }
        }
        assert_eq!(streams.len(), 60);
        for (job, stream) in streams {
            assert_eq!(
                stream,
                [1, 2, 3],
                "job {job}: deduplicated by event id, in order"
            );
        }
        let mut sleeper = sleeper;
        let (a, b) = tokio::task::spawn_blocking(move || {
            (
                sleeper.terminate(Duration::from_secs(30)),
                heir.terminate(Duration::from_secs(30)),
            )
        })
        .await
        .unwrap();
        assert!(a.success() && b.success());
    })
    .await
    .expect("timed out");
}

/// Writes one event per job per round (ACCEPTED, then checkpoints), a
/// round a transaction, until `stop`; returns the last sequence written.
async fn keep_writing(pool: PgPool, jobs: Vec<Uuid>, stop: CancellationToken) -> i64 {
    let mut sequence = 0;
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.is_cancelled() {
        pace.tick().await;
        sequence += 1;
        insert_at(&pool, &round(&jobs, sequence)).await;
    }
    sequence
}

async fn owned_by(pool: &PgPool, relay_id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM relay_bucket WHERE owner = $1 AND lease_until > now()")
        .bind(relay_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Polls `check` every 50 ms until it holds, failing after 60 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The relay is stopped (SIGSTOP) in the middle of a stream: events keep
/// arriving, some of its rows are on their way. Another relay takes its
/// buckets over and publishes on; then the first wakes up with whatever it
/// had in flight. Every copy on the topic, read back: per job, a repeat
/// may appear, but never an earlier sequence after a later one, and
/// without repeats each job's events are exactly 1..=k.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_relay_paused_mid_stream_and_resumed_never_puts_a_jobs_sequence_back(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let topic = unique("paused-mid-stream");
        create_topic(&topic, 3).await.unwrap();
        let url = flotilla_tests::database::url_of(&pool).await;
        let jobs: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
        let start = |id: &'static str| {
            let (topic, url) = (topic.clone(), url.clone());
            tokio::task::spawn_blocking(move || {
                relay_process_on(
                    &bootstrap_servers(),
                    &topic,
                    id,
                    &url,
                    &[("RUST_LOG", "info,flotilla_relay=debug")],
                )
            })
        };
        let sleeper = start("sleeper").await.unwrap();
        let stop_writing = CancellationToken::new();
        let writer = tokio::spawn(keep_writing(
            pool.clone(),
            jobs.clone(),
            stop_writing.clone(),
        ));

        // Mid-stream: it has published a few rounds, and it is stopped the
        // moment a fresh log line of its reads counts rows it sent and has
        // not marked yet.
        eventually("the first relay streams", || async {
            count(&pool, "PUBLISHED").await >= 100
        })
        .await;
        let (sleeper, in_flight_at_pause) = tokio::task::spawn_blocking(move || {
            let mut sleeper = sleeper;
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                sleeper.wait_for_line("in_flight=", Duration::from_secs(30));
                let line = sleeper.output.last().unwrap();
                let in_flight: usize = line.rsplit("in_flight=").next().unwrap().trim().parse().unwrap();
                let logged: chrono::DateTime<Utc> = line.split_whitespace().next().unwrap().parse().unwrap();
                if in_flight > 0 && Utc::now() - logged < chrono::TimeDelta::milliseconds(20) {
                    sleeper.signal("STOP");
                    return (sleeper, in_flight);
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "never caught the relay with rows in flight"
                );
            }
        })
        .await
        .unwrap();
        let pending_at_pause = count(&pool, "PENDING").await;
        let published_at_pause = count(&pool, "PUBLISHED").await;

        // The heir takes every bucket once the sleeper's leases lapse, and
        // publishes on while events keep coming.
        let heir = start("heir").await.unwrap();
        eventually("the heir holds every bucket", || async {
            owned_by(&pool, "heir").await == 64
        })
        .await;
        let taken_over = count(&pool, "PUBLISHED").await;
        eventually("the heir publishes", || async {
            count(&pool, "PUBLISHED").await >= taken_over + 100
        })
        .await;

        // The sleeper wakes with what it had in flight, rejoins and gets a
        // share of the buckets back; both publish on.
        sleeper.signal("CONT");
        eventually("the sleeper gets buckets back", || async {
            owned_by(&pool, "sleeper").await > 0
        })
        .await;
        let shared = count(&pool, "PUBLISHED").await;
        eventually("both publish", || async {
            count(&pool, "PUBLISHED").await >= shared + 100
        })
        .await;
        stop_writing.cancel();
        let last = writer.await.unwrap();
        eventually("every row published", || async {
            count(&pool, "PENDING").await == 0
        })
        .await;
        assert_eq!(count(&pool, "FAILED").await, 0);
        assert_eq!(count(&pool, "PUBLISHED").await, 20 * last);

        let on_topic = copies_on_topic(&bootstrap_servers(), &topic, 3);
        let events = read_events(&bootstrap_servers(), &topic, on_topic).await;
        let (distinct, repeats) = without_repeats(&events);
        assert_eq!(distinct.len(), 20);
        let expected: Vec<i64> = (1..=last).collect();
        for (job, sequences) in distinct {
            assert_eq!(sequences, expected, "job {job}, without repeats");
        }
        println!(
            "paused with {in_flight_at_pause} rows in flight, {pending_at_pause} pending, after {published_at_pause} published; \
             {} events per job; {on_topic} copies on the topic, {repeats} of them repeats",
            last
        );

        let (mut sleeper, mut heir) = (sleeper, heir);
        let (a, b) = tokio::task::spawn_blocking(move || {
            (
                sleeper.terminate(Duration::from_secs(30)),
                heir.terminate(Duration::from_secs(30)),
            )
        })
        .await
        .unwrap();
        assert!(a.success() && b.success());
    })
    .await
    .expect("timed out");
}

/// Inserts the events `(job, sequence)` in one transaction, so one read of
/// the relay sees them all.
async fn insert_at(pool: &PgPool, events: &[(Uuid, i64)]) {
    let mut tx = pool.begin().await.unwrap();
    for &(job_id, sequence) in events {
        let stamp = EventStamp {
            metadata: None,
            job_id,
            event_sequence: sequence,
            workflow_name: "stalled".into(),
            workflow_version: None,
            attempt: 1,
            traceparent: None,
            tracestate: None,
        };
        let kind = if sequence == 1 {
            EventKind::Accepted
        } else {
            EventKind::StepCheckpoint {
                step: format!("step{sequence}"),
                note: None,
            }
        };
        outbox::insert(&mut tx, &stamp, kind, Utc::now())
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Event `sequence` of every job in `jobs`.
fn round(jobs: &[Uuid], sequence: i64) -> Vec<(Uuid, i64)> {
    jobs.iter().map(|job| (*job, sequence)).collect()
}

/// The worst case of a stall: the relay hands a round of events to its
/// producer while the broker is down, so they wait inside the producer;
/// then it stops (SIGSTOP) past its lease, the broker returns, and another
/// relay publishes those events and the next round. When the first wakes,
/// what waited in its producer must not reach the topic after the later
/// events: a record handed to the producer expires before the lease it was
/// sent under can pass to another relay.
#[sqlx::test(migrator = "MIGRATOR")]
async fn records_waiting_in_a_stalled_relays_producer_never_land_after_the_heirs(pool: PgPool) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let dir = std::env::temp_dir().join(format!("flotilla-stalled-{}", Uuid::new_v4()));
        let mut kafka = OwnKafka::started(&dir, KafkaOptions::default()).await;
        let topic = unique("stalled-producer");
        let bootstrap = kafka.address.clone();
        flotilla_tests::create_topic_on(&bootstrap, &topic, 3)
            .await
            .unwrap();
        let url = flotilla_tests::database::url_of(&pool).await;
        // Five jobs start in the first round, five more in the second: only
        // the second has ten events in flight at once.
        let (early, late): (Vec<Uuid>, Vec<Uuid>) = (
            (0..5).map(|_| Uuid::new_v4()).collect(),
            (0..5).map(|_| Uuid::new_v4()).collect(),
        );
        let start = |id: &'static str| {
            let (bootstrap, topic, url) = (bootstrap.clone(), topic.clone(), url.clone());
            tokio::task::spawn_blocking(move || {
                relay_process_on(
                    &bootstrap,
                    &topic,
                    id,
                    &url,
                    &[("RUST_LOG", "info,flotilla_relay=debug")],
                )
            })
        };
        let sleeper = start("sleeper").await.unwrap();
        insert_at(&pool, &round(&early, 1)).await;
        eventually("the first relay publishes", || async {
            count(&pool, "PUBLISHED").await == 5
        })
        .await;

        // The broker goes away; the second round is handed to the producer
        // and waits there: the next read counts it in flight. The relay
        // stops right after.
        kafka.kill();
        insert_at(&pool, &[round(&early, 2), round(&late, 1)].concat()).await;
        let sleeper = tokio::task::spawn_blocking(move || {
            let mut sleeper = sleeper;
            sleeper.wait_for_line("in_flight=10", Duration::from_secs(30));
            sleeper
        })
        .await
        .unwrap();
        sleeper.signal("STOP");

        // The broker returns; the heir takes over and publishes rounds 2 and 3.
        let kafka = kafka.restarted().await;
        insert_at(&pool, &[round(&early, 3), round(&late, 2)].concat()).await;
        let heir = start("heir").await.unwrap();
        eventually("the heir publishes rounds 2 and 3", || async {
            count(&pool, "PUBLISHED").await == 25
        })
        .await;

        // The sleeper wakes; what waited in its producer ends one way or
        // the other (expired, or sent and fenced at marking) and is marked:
        // the first markings since it stopped.
        sleeper.signal("CONT");
        let mut sleeper = tokio::task::spawn_blocking(move || {
            let mut sleeper = sleeper;
            let mut ended = 0;
            while ended < 10 {
                sleeper.wait_for_line("marked count=", Duration::from_secs(30));
                let line = sleeper.output.last().unwrap();
                println!("the sleeper, on waking: {line}");
                let count = line.split("marked count=").nth(1).unwrap();
                let count: usize = count.split(' ').next().unwrap().parse().unwrap();
                ended += count;
            }
            sleeper
        })
        .await
        .unwrap();
        assert_eq!(count(&pool, "PENDING").await, 0);

        let on_topic = copies_on_topic(&bootstrap, &topic, 3);
        let events = read_events(&bootstrap, &topic, on_topic).await;
        let (distinct, repeats) = without_repeats(&events);
        assert_eq!(distinct.len(), 10);
        for (job, sequences) in distinct {
            let expected: &[i64] = if early.contains(&job) {
                &[1, 2, 3]
            } else {
                &[1, 2]
            };
            assert_eq!(sequences, expected, "job {job}, without repeats");
        }
        println!("{on_topic} copies on the topic, {repeats} of them repeats");

        let mut heir = heir;
        let (a, b) = tokio::task::spawn_blocking(move || {
            (
                sleeper.terminate(Duration::from_secs(30)),
                heir.terminate(Duration::from_secs(30)),
            )
        })
        .await
        .unwrap();
        assert!(a.success() && b.success());
        drop(kafka);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("timed out");
}

/// Handing buckets over when another relay joins: a bucket with rows on
/// their way (sent, not yet marked) is not released, or a record still in
/// the producer could reach the broker after the next owner's later
/// events. It stops being sent from and goes once idle.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_bucket_with_rows_on_their_way_is_released_only_once_idle(pool: PgPool) {
    use flotilla_relay::buckets::BucketLeases;

    let lease = Duration::from_secs(10);
    let owned = |relay: &'static str| {
        let pool = pool.clone();
        async move {
            let buckets: Vec<i16> = sqlx::query_scalar(
                "SELECT bucket FROM relay_bucket WHERE owner = $1 ORDER BY bucket",
            )
            .bind(relay)
            .fetch_all(&pool)
            .await
            .unwrap();
            buckets
        }
    };
    let first = BucketLeases::new(pool.clone(), "first".into(), lease);
    assert_eq!(first.rebalance().await.unwrap().len(), 64);
    let second = BucketLeases::new(pool.clone(), "second".into(), lease);
    assert!(
        second.rebalance().await.unwrap().is_empty(),
        "nothing free yet"
    );

    // The first relay's share is now 32; only buckets 0..8 are idle.
    let busy: std::collections::HashSet<i16> = (8..64).collect();
    let sendable = first.rebalance_keeping(&busy).await.unwrap();
    assert_eq!(
        owned("first").await,
        (8..64).collect::<Vec<i16>>(),
        "no busy bucket released"
    );
    assert_eq!(
        sendable,
        (8..40).collect::<Vec<i16>>(),
        "sent from: its share"
    );
    assert!(
        first.held().holds(8) && !first.held().holds(40),
        "above the share, busy: no more sends"
    );
    assert_eq!(
        second.rebalance().await.unwrap(),
        (0..8).collect::<Vec<i16>>()
    );

    // Once idle, the rest of what is above the share goes.
    let sendable = first
        .rebalance_keeping(&std::collections::HashSet::new())
        .await
        .unwrap();
    assert_eq!(sendable, (8..40).collect::<Vec<i16>>());
    assert_eq!(owned("first").await, (8..40).collect::<Vec<i16>>());
    let taken = second.rebalance().await.unwrap();
    assert_eq!(taken.len(), 32);
    assert!(taken.iter().all(|bucket| !(8..40).contains(bucket)));
}

/// What the fence does not promise: a record already on the wire when its
/// relay's lease lapses (sent, held up on a slow network) can still land
/// after the heir's later events. The first copy of each event stays in
/// order; the stale one trails, a repeat of an earlier `sequence` with the
/// same `event_id`, which consumers drop (docs/operations.md, "What
/// consumers of the event topic must do"). A broker of the test's own
/// behind a proxy that holds the first relay's connections.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_record_on_the_wire_when_its_lease_lapses_can_trail_as_a_repeat_and_first_copies_stay_in_order(
    pool: PgPool,
) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, async {
        let dir = std::env::temp_dir().join(format!("flotilla-trailing-{}", Uuid::new_v4()));
        let broker_port = flotilla_tests::free_port();
        let proxy = flotilla_tests::proxy::Proxy::start(
            format!("127.0.0.1:{broker_port}").parse().unwrap(),
        )
        .await;
        let bootstrap = proxy.address().to_string();
        let broker = {
            let options = flotilla_tests::kafka::KafkaOptions {
                port: Some(broker_port),
                advertised: Some(bootstrap.clone()),
                ..Default::default()
            };
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || {
                flotilla_tests::kafka::OwnKafka::start_with(&dir, options)
            })
            .await
            .unwrap()
        };
        let topic = unique("trailing");
        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .create()
                .unwrap();
        let created = admin
            .create_topics(
                [&rdkafka::admin::NewTopic::new(
                    &topic,
                    1,
                    rdkafka::admin::TopicReplication::Fixed(1),
                )],
                &rdkafka::admin::AdminOptions::new(),
            )
            .await
            .unwrap();
        assert!(created.iter().all(Result::is_ok), "{created:?}");
        std::thread::spawn(move || drop(admin));
        let url = flotilla_tests::database::url_of(&pool).await;
        let job = Uuid::new_v4();
        let start = |id: &'static str| {
            let (bootstrap, topic, url) = (bootstrap.clone(), topic.clone(), url.clone());
            tokio::task::spawn_blocking(move || {
                relay_process_on(
                    &bootstrap,
                    &topic,
                    id,
                    &url,
                    &[("RUST_LOG", "info,flotilla_relay=debug")],
                )
            })
        };
        let stale = start("stale").await.unwrap();
        insert_at(&pool, &[(job, 1)]).await;
        eventually("the first relay publishes sequence 1", || async {
            count(&pool, "PUBLISHED").await == 1
        })
        .await;

        // From now on what the first relay sends waits in the proxy: its
        // record of sequence 2 is on the wire. It stops past its lease.
        proxy.hold();
        insert_at(&pool, &[(job, 2)]).await;
        let mut stale = tokio::task::spawn_blocking(move || {
            let mut stale = stale;
            stale.wait_for_line("rows=1 ", Duration::from_secs(30));
            stale
        })
        .await
        .unwrap();
        eventually("the record of sequence 2 is on the wire, held", || async {
            proxy.held_bytes() > 0
        })
        .await;
        stale.signal("STOP");

        // The heir takes the buckets over and publishes 2, then 3.
        insert_at(&pool, &[(job, 3)]).await;
        let heir = start("heir").await.unwrap();
        eventually("the heir publishes sequences 2 and 3", || async {
            count(&pool, "PUBLISHED").await == 3
        })
        .await;

        // The slow network delivers the first relay's record at last.
        proxy.release();
        // The proxy runs on this test's thread: the client's blocking calls
        // go elsewhere.
        eventually("the held record lands", || {
            let (bootstrap, topic) = (bootstrap.clone(), topic.clone());
            async move {
                tokio::task::spawn_blocking(move || copies_on_topic(&bootstrap, &topic, 1))
                    .await
                    .unwrap()
                    == 4
            }
        })
        .await;
        let events = read_events(&bootstrap, &topic, 4).await;
        let raw: Vec<i64> = events.iter().map(|(_, _, e, _)| e.sequence()).collect();
        assert_eq!(
            raw,
            [1, 2, 3, 2],
            "the stale copy trails the heir's later event"
        );
        let ids: Vec<Uuid> = events.iter().map(|(_, _, e, _)| e.event_id()).collect();
        assert_eq!(
            ids[1], ids[3],
            "the trailing copy is a repeat: the same event id"
        );
        // What a consumer keeps, dropping any sequence at or below the last
        // one it kept: every event once, in order.
        let mut last = 0;
        let kept: Vec<i64> = raw
            .into_iter()
            .filter(|sequence| {
                let new = *sequence > last;
                last = last.max(*sequence);
                new
            })
            .collect();
        assert_eq!(kept, [1, 2, 3]);

        stale.signal("CONT");
        let mut heir = heir;
        tokio::task::spawn_blocking(move || {
            stale.kill();
            heir.terminate(Duration::from_secs(30));
        })
        .await
        .unwrap();
        drop(broker);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("timed out");
}
