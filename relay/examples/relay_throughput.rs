//! Relay figures on this machine: events per second published (rows past
//! their bucket's progress) for a backlog with 1 and with 2 relays, against
//! a real broker. Latency under steady load is the benchmark's
//! (`scripts/bench`, the end-to-end figures).
//!
//! `cargo run --release -p flotilla-relay --example relay_throughput -- [backlog]`
//! with `DATABASE_URL` and `KAFKA_BOOTSTRAP_SERVERS` (`scripts/services env`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_relay::{Relay, RelaySettings};
use flotilla_runtime::BrokerConfig;
use flotilla_store::SystemClock;
use flotilla_tests::scratch::ScratchDatabase;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Inserts `count` ACCEPTED events, one per job, in one statement.
const INSERT: &str = "
    INSERT INTO workflow_run_outbox (event_id, job_id, sequence, event_type, payload, created_at)
    SELECT e, j, 1, 'ACCEPTED', jsonb_build_object(
        'event_id', e, 'job_id', j, 'sequence', 1, 'type', 'ACCEPTED', 'workflow_name', 'bench',
        'attempt', 0, 'step_name', NULL, 'verdict', NULL, 'error', NULL, 'result', NULL,
        'occurred_at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')),
        clock_timestamp()
    FROM (SELECT gen_random_uuid() AS e, gen_random_uuid() AS j FROM generate_series(1, $1)) ids";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn").init();
    let backlog: i64 = std::env::args().nth(1).map_or(Ok(100_000), |a| a.parse())?;
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")?;
    let scratch = ScratchDatabase::create("flotilla_relay", 8).await?;
    let result = measure(&scratch.pool, &bootstrap, backlog).await;
    scratch.drop_now().await?;
    result
}

async fn published(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM workflow_run_outbox_state WHERE status = 'PUBLISHED'",
    )
    .fetch_one(pool)
    .await?)
}

fn start(
    pool: &PgPool,
    bootstrap: &str,
    topic: &str,
    relays: usize,
    stop: &CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    (0..relays)
        .map(|n| {
            let mut settings =
                RelaySettings::new(BrokerConfig::new(bootstrap), topic, &format!("bench-{n}"));
            settings.batch_size = 2_000;
            settings.idle_poll_max = Duration::from_millis(10);
            let relay = Relay::new(pool.clone(), Arc::new(SystemClock), settings)?;
            let stop = stop.clone();
            Ok(tokio::spawn(async move {
                relay.run(stop, Duration::from_secs(10)).await
            }))
        })
        .collect()
}

async fn measure(pool: &PgPool, bootstrap: &str, backlog: i64) -> anyhow::Result<()> {
    for relays in [1, 2] {
        let topic = format!("relay-bench-{}", Uuid::new_v4().simple());
        flotilla_runtime::kafka::ensure_topics(&BrokerConfig::new(bootstrap), &[&topic], layout())
            .await?;
        sqlx::query("TRUNCATE workflow_run_outbox")
            .execute(pool)
            .await?;
        sqlx::query(INSERT).bind(backlog).execute(pool).await?;
        let stop = CancellationToken::new();
        let started = Instant::now();
        let handles = start(pool, bootstrap, &topic, relays, &stop)?;
        while published(pool).await? < backlog {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let elapsed = started.elapsed();
        stop.cancel();
        for handle in handles {
            handle.await?;
        }
        println!(
            "backlog: {backlog} events with {relays} relay(s) in {:.1} s = {:.0} events/s",
            elapsed.as_secs_f64(),
            backlog as f64 / elapsed.as_secs_f64()
        );
    }

    Ok(())
}

/// Three partitions, one replica: the single broker of `scripts/services`.
fn layout() -> flotilla_runtime::kafka::TopicLayout {
    flotilla_runtime::kafka::TopicLayout {
        create_topics: true,
        topic_partitions: 3,
        topic_replication: 1,
        topic_min_insync_replicas: flotilla_runtime::kafka::BROKER_DEFAULT,
    }
}
