//! Offsets kept with the rows: a database that comes back without its last
//! commits (what an asynchronous standby promoted by a failover holds) has
//! lost their offsets too, and the consumer newly assigned the partitions
//! goes back to read those requests again, though Kafka's committed
//! offsets are past them.

use std::collections::HashSet;

use flotilla_contracts::WorkflowRunRequest;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use super::support::{self, PARTITIONS, count, produce_raw, producer, topics};
use super::{MIGRATOR, spawn, wait_rows, within_deadline};

/// Produces a `greet` request as JSON; its job id and partition.
async fn produce(producer: &rdkafka::producer::FutureProducer, topic: &str) -> (Uuid, i32) {
    let job_id = Uuid::new_v4();
    let request = WorkflowRunRequest::new(job_id, "greet", json!({"name": "n"})).unwrap();
    let bytes = flotilla_contracts::json::encode(&request).unwrap();
    let (partition, _) = produce_raw(producer, topic, &job_id.to_string(), &bytes, None).await;
    (job_id, partition)
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn requests_whose_rows_the_database_lost_are_read_again_from_the_offsets_it_kept(
    pool: PgPool,
) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();

        // What the standby has: requests on every partition, their rows
        // and their offsets.
        let mut partitions = HashSet::new();
        let mut kept = 0;
        while kept < 12 || partitions.len() < usize::try_from(PARTITIONS).unwrap() {
            partitions.insert(produce(&producer, &topics.requests).await.1);
            kept += 1;
        }
        let (stop, running) = spawn(support::consumer(&engine, &topics));
        wait_rows(&pool, kept).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        let standby: Vec<(String, i32, i64)> = sqlx::query_as(
            "SELECT topic, partition, next_offset FROM consumer_offset WHERE group_id = $1",
        )
        .bind(&topics.group)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(standby.len(), partitions.len(), "{standby:?}");

        // What only the primary had: eight more, committed to Kafka.
        let mut lost = Vec::new();
        for _ in 0..8 {
            lost.push(produce(&producer, &topics.requests).await.0);
        }
        wait_rows(&pool, kept + 8).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        running.await.unwrap();

        // The failover: the last commits are gone, rows and offsets alike.
        sqlx::query("DELETE FROM workflow_run_outbox WHERE job_id = ANY($1)")
            .bind(&lost)
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("DELETE FROM workflow_run WHERE job_id = ANY($1)")
            .bind(&lost)
            .execute(&pool)
            .await
            .unwrap();
        for (topic, partition, next_offset) in &standby {
            sqlx::query(
                "UPDATE consumer_offset SET next_offset = $4
                 WHERE group_id = $1 AND topic = $2 AND partition = $3",
            )
            .bind(&topics.group)
            .bind(topic)
            .bind(partition)
            .bind(next_offset)
            .execute(&pool)
            .await
            .unwrap();
        }
        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, kept);

        // A consumer of the same group reads them again: none lost.
        let (stop, running) = spawn(support::consumer(&engine, &topics));
        wait_rows(&pool, kept + 8).await;
        let back: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run WHERE job_id = ANY($1)")
            .bind(&lost)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(back, 8, "every request the database lost is a row again");
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        let ends: i64 = count(
            &pool,
            &format!(
                "SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offset WHERE group_id = '{}'",
                topics.group
            ),
        )
        .await;
        assert_eq!(ends, kept + 8, "the database's offsets are at the end again");
        stop.cancel();
        running.await.unwrap();
    })
    .await;
}
