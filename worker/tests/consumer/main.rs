//! The request consumer against the real broker, registry and Postgres
//! (guarantee 9 in docs/architecture.md). Every test has its own topics, group, database
//! and deadline.

mod codecs;
mod flow;
mod group;
mod hostile;
mod lag;
mod offsets;
mod poison;
mod replies;
mod seat;
mod signals;

mod support;

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use flotilla_contracts::framing;
use flotilla_tests::KAFKA_TEST_TIMEOUT;
use flotilla_worker::ingest::BatchReport;
use flotilla_worker::ingest::dead_letter::{
    CODE, REASON, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC, VALUE_DROPPED,
};
use serde_json::json;
use sqlx::PgPool;
use support::{count, produce_raw, produce_request, producer, topics};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

async fn within_deadline(test: impl Future<Output = ()>) {
    tokio::time::timeout(KAFKA_TEST_TIMEOUT, test)
        .await
        .expect("the consumer test timed out");
}

/// Runs the consumer in the background; returns its stop switch and handle.
fn spawn(
    consumer: flotilla_worker::ingest::RequestConsumer,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<flotilla_worker::ingest::ConsumerStats>,
) {
    let stop = CancellationToken::new();
    let handle = tokio::spawn(consumer.run(stop.clone()));
    (stop, handle)
}

async fn wait_rows(pool: &PgPool, expected: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(pool, "SELECT count(*) FROM workflow_run").await < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rows never reached {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
