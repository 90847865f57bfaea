//! Offsets kept with the rows: a database that comes back without its last
//! commits (what an asynchronous standby promoted by a failover holds) has
//! lost their offsets too, and the consumer goes back to read those
//! requests again, though Kafka's committed offsets are past them: on a
//! new assignment, and under a member that keeps its partitions. A group
//! Kafka keeps no offsets for resumes at the database's.

use std::collections::HashSet;

use flotilla_contracts::WorkflowRunRequest;
use flotilla_runtime::kafka::GroupProtocol;
use flotilla_store::consumer_offsets::{self, PartitionOffset};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::support::{self, PARTITIONS, Topics, count, produce_raw, producer, topics};
use super::{MIGRATOR, spawn, wait_rows, within_deadline};

/// Produces a `greet` request as JSON; its job id and partition.
async fn produce(producer: &rdkafka::producer::FutureProducer, topic: &str) -> (Uuid, i32) {
    let job_id = Uuid::new_v4();
    let request = WorkflowRunRequest::new(job_id, "greet", json!({"name": "n"})).unwrap();
    let bytes = flotilla_contracts::json::encode(&request).unwrap();
    let (partition, _) = produce_raw(producer, topic, &job_id.to_string(), &bytes, None).await;
    (job_id, partition)
}

/// A running consumer, what a standby would hold and what only the
/// primary had.
struct Diverged {
    stop: CancellationToken,
    running: Option<tokio::task::JoinHandle<flotilla_worker::ingest::ConsumerStats>>,
    /// Rows the standby holds (requests on every partition).
    kept: i64,
    /// The standby's offsets: (topic, partition, next offset).
    standby: Vec<(String, i32, i64)>,
    /// Requests whose rows and offsets only the primary had.
    lost: Vec<Uuid>,
    partitions: HashSet<i32>,
}

/// Runs a consumer through requests on every partition (the standby's
/// state: rows and offsets), then eight more, all committed to Kafka.
async fn diverged(pool: &PgPool, topics: &Topics) -> Diverged {
    let engine = support::engine(pool);
    support::register_greet(&engine).await;
    let producer = producer();
    let mut partitions = HashSet::new();
    let mut kept = 0;
    while kept < 12 || partitions.len() < usize::try_from(PARTITIONS).unwrap() {
        partitions.insert(produce(&producer, &topics.requests).await.1);
        kept += 1;
    }
    let (stop, running) = spawn(support::consumer(&engine, topics));
    wait_rows(pool, kept).await;
    support::wait_committed_to_end(&topics.requests, &topics.group).await;
    let standby: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT topic, partition, next_offset FROM consumer_offset WHERE group_id = $1",
    )
    .bind(&topics.group)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(standby.len(), partitions.len(), "{standby:?}");
    let mut lost = Vec::new();
    for _ in 0..8 {
        lost.push(produce(&producer, &topics.requests).await.0);
    }
    wait_rows(pool, kept + 8).await;
    support::wait_committed_to_end(&topics.requests, &topics.group).await;
    Diverged {
        stop,
        running: Some(running),
        kept,
        standby,
        lost,
        partitions,
    }
}

impl Diverged {
    async fn stop_consumer(&mut self) {
        self.stop.cancel();
        if let Some(running) = self.running.take() {
            running.await.unwrap();
        }
    }

    /// The failover: the last commits are gone, rows and offsets alike.
    async fn fail_over(&self, pool: &PgPool, group: &str) {
        for table in ["workflow_run_outbox", "workflow_run"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE job_id = ANY($1)"))
                .bind(&self.lost)
                .execute(pool)
                .await
                .unwrap();
        }
        for (topic, partition, next_offset) in &self.standby {
            sqlx::query(
                "UPDATE consumer_offset SET next_offset = $4
                 WHERE group_id = $1 AND topic = $2 AND partition = $3",
            )
            .bind(group)
            .bind(topic)
            .bind(partition)
            .bind(next_offset)
            .execute(pool)
            .await
            .unwrap();
        }
        assert_eq!(
            count(pool, "SELECT count(*) FROM workflow_run").await,
            self.kept
        );
    }

    async fn lost_rows_back(&self, pool: &PgPool) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM workflow_run WHERE job_id = ANY($1)")
            .bind(&self.lost)
            .fetch_one(pool)
            .await
            .unwrap()
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn requests_whose_rows_the_database_lost_are_read_again_from_the_offsets_it_kept(
    pool: PgPool,
) {
    read_again_on_a_new_assignment(pool, GroupProtocol::Classic).await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn requests_whose_rows_the_database_lost_are_read_again_consumer_protocol(pool: PgPool) {
    read_again_on_a_new_assignment(pool, GroupProtocol::Consumer).await;
}

async fn read_again_on_a_new_assignment(pool: PgPool, protocol: GroupProtocol) {
    within_deadline(async {
        let topics = support::topics_for(protocol).await;
        let mut diverged = diverged(&pool, &topics).await;
        diverged.stop_consumer().await;
        diverged.fail_over(&pool, &topics.group).await;

        // A consumer of the same group reads them again: none lost.
        let engine = support::engine(&pool);
        let (stop, running) = spawn(support::consumer(&engine, &topics));
        wait_rows(&pool, diverged.kept + 8).await;
        assert_eq!(
            diverged.lost_rows_back(&pool).await,
            8,
            "every request the database lost is a row again"
        );
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        let ends: i64 = count(
            &pool,
            &format!(
                "SELECT coalesce(sum(next_offset), 0)::bigint FROM consumer_offset WHERE group_id = '{}'",
                topics.group
            ),
        )
        .await;
        assert_eq!(ends, diverged.kept + 8, "the database's offsets are at the end again");
        stop.cancel();
        running.await.unwrap();
    })
    .await;
}

/// The same loss under a member that keeps its partitions (no rebalance):
/// at its next batch it finds the database holding less than it wrote,
/// seeks back and reads the lost requests again.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_member_that_keeps_its_partitions_reads_again_what_the_database_lost_under_it(
    pool: PgPool,
) {
    read_again_under_a_member(pool, GroupProtocol::Classic).await;
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_member_that_keeps_its_partitions_reads_again_what_was_lost_consumer_protocol(
    pool: PgPool,
) {
    read_again_under_a_member(pool, GroupProtocol::Consumer).await;
}

async fn read_again_under_a_member(pool: PgPool, protocol: GroupProtocol) {
    within_deadline(async {
        let topics = support::topics_for(protocol).await;
        let mut diverged = diverged(&pool, &topics).await;
        diverged.fail_over(&pool, &topics.group).await;
        // One request on every partition: each partition's next batch
        // finds the database behind what the member wrote.
        let producer = producer();
        let mut after = 0;
        let mut reached = HashSet::new();
        while reached.len() < diverged.partitions.len() {
            reached.insert(produce(&producer, &topics.requests).await.1);
            after += 1;
        }
        wait_rows(&pool, diverged.kept + 8 + after).await;
        assert_eq!(
            diverged.lost_rows_back(&pool).await,
            8,
            "every request the database lost is a row again"
        );
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        diverged.stop_consumer().await;
    })
    .await;
}

/// The same loss under a member that keeps its partitions, with nothing
/// more produced after the failover (the requests stop with the primary):
/// no next batch comes to find the database behind, so the member looks by
/// itself, every few seconds, and reads the lost requests again.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_member_that_keeps_its_partitions_finds_a_loss_under_it_with_no_new_request(
    pool: PgPool,
) {
    within_deadline(async {
        let topics = topics().await;
        let mut diverged = diverged(&pool, &topics).await;
        diverged.fail_over(&pool, &topics.group).await;
        wait_rows(&pool, diverged.kept + 8).await;
        assert_eq!(
            diverged.lost_rows_back(&pool).await,
            8,
            "every request the database lost is a row again"
        );
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        diverged.stop_consumer().await;
    })
    .await;
}

/// Every offset row of `group`, as (topic, partition, next offset).
async fn offsets_of(pool: &PgPool, group: &str) -> Vec<(String, i32, i64)> {
    sqlx::query_as(
        "SELECT topic, partition, next_offset FROM consumer_offset WHERE group_id = $1 ORDER BY 2",
    )
    .bind(group)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Twelve requests through the running consumer, rows and commits done;
/// their job ids.
async fn twelve_through(pool: &PgPool, topics: &Topics) -> Vec<Uuid> {
    let producer = producer();
    let mut jobs = Vec::new();
    for _ in 0..12 {
        jobs.push(produce(&producer, &topics.requests).await.0);
    }
    wait_rows(pool, 12).await;
    support::wait_committed_to_end(&topics.requests, &topics.group).await;
    jobs
}

/// The failover of the tests below: every row gone.
async fn lose_every_row(pool: &PgPool) {
    for table in ["workflow_run_outbox", "workflow_run"] {
        sqlx::query(&format!("DELETE FROM {table}"))
            .execute(pool)
            .await
            .unwrap();
    }
}

/// Waits until the twelve `lost` are rows again.
async fn twelve_back(pool: &PgPool, lost: &[Uuid]) {
    wait_rows(pool, 12).await;
    let back: i64 = sqlx::query_scalar("SELECT count(*) FROM workflow_run WHERE job_id = ANY($1)")
        .bind(lost)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(back, 12, "every request the database lost is a row again");
}

/// Where a partition starts is in the database before any row of it, so
/// a failover that loses a partition's first batches (their rows and the
/// offsets after them) still leaves an offset behind Kafka's to go back
/// to. Here the rows cannot be written at all (a trigger refuses them, an
/// outage the consumer rides out), and the offsets are there already.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_partition_has_its_offset_in_the_database_before_its_first_rows(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        sqlx::raw_sql(
            "CREATE FUNCTION refuse_rows() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'rows are not being written'; END $$;
             CREATE TRIGGER refuse_rows BEFORE INSERT ON workflow_run
                 FOR EACH ROW EXECUTE FUNCTION refuse_rows();",
        )
        .execute(&pool)
        .await
        .unwrap();
        let producer = producer();
        let mut partitions = HashSet::new();
        let mut jobs = Vec::new();
        while jobs.len() < 12 || partitions.len() < usize::try_from(PARTITIONS).unwrap() {
            let (job, partition) = produce(&producer, &topics.requests).await;
            jobs.push(job);
            partitions.insert(partition);
        }
        let (stop, running) = spawn(support::consumer(&engine, &topics));
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            // The partitions of the first batch, whose rows wait.
            let anchored = offsets_of(&pool, &topics.group).await;
            if !anchored.is_empty() {
                assert!(
                    anchored.iter().all(|(_, _, next)| *next == 0),
                    "each partition's offset is where it starts: {anchored:?}"
                );
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no offset in the database for a partition whose rows are not written"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(count(&pool, "SELECT count(*) FROM workflow_run").await, 0);
        sqlx::raw_sql("DROP TRIGGER refuse_rows ON workflow_run")
            .execute(&pool)
            .await
            .unwrap();
        wait_rows(&pool, i64::try_from(jobs.len()).unwrap()).await;
        assert_eq!(
            offsets_of(&pool, &topics.group).await.len(),
            partitions.len()
        );
        stop.cancel();
        running.await.unwrap();
    })
    .await;
}

/// A failover that lost everything the member wrote, even the offsets of
/// its assignment, under a member that keeps its partitions: it goes back
/// to where it started them.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_member_whose_database_lost_every_offset_it_wrote_goes_back_to_where_it_started(
    pool: PgPool,
) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let (stop, running) = spawn(support::consumer(&engine, &topics));
        let lost = twelve_through(&pool, &topics).await;
        // The failover, the member running: nothing of the group is left.
        lose_every_row(&pool).await;
        sqlx::query("DELETE FROM consumer_offset WHERE group_id = $1")
            .bind(&topics.group)
            .execute(&pool)
            .await
            .unwrap();
        twelve_back(&pool, &lost).await;
        stop.cancel();
        running.await.unwrap();
    })
    .await;
}

/// The end of each partition of `topic`: (partition, high watermark).
async fn ends_of(topic: &str) -> Vec<(i32, i64)> {
    let topic = topic.to_owned();
    let ends = tokio::task::spawn_blocking(move || {
        support::committed_and_end(&topic, &flotilla_tests::unique("nobody"))
    })
    .await
    .unwrap();
    (0..PARTITIONS)
        .zip(ends.into_iter().map(|(_, end)| end))
        .collect()
}

/// Review K11 (b): a group Kafka keeps no offsets for (renamed, or its
/// offsets expired after `offsets.retention.minutes` or were deleted) whose
/// offsets the database kept resumes where the database says, not at the
/// topic's start. The requests before the database's offsets have no rows
/// here, so reading them again would show as rows.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_group_without_kafka_offsets_resumes_at_the_databases_not_the_topics_start(pool: PgPool) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        let mut partitions = HashSet::new();
        let mut before = 0;
        while before < 12 || partitions.len() < usize::try_from(PARTITIONS).unwrap() {
            partitions.insert(produce(&producer, &topics.requests).await.1);
            before += 1;
        }
        let kept: Vec<PartitionOffset> = ends_of(&topics.requests)
            .await
            .into_iter()
            .map(|(partition, next_offset)| PartitionOffset {
                topic: topics.requests.clone(),
                partition,
                next_offset,
            })
            .collect();
        consumer_offsets::record(&pool, &topics.group, &kept)
            .await
            .unwrap();
        let mut after = HashSet::new();
        for _ in 0..6 {
            after.insert(produce(&producer, &topics.requests).await.0);
        }

        let (stop, running) = spawn(support::consumer(&engine, &topics));
        wait_rows(&pool, 6).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        let rows: HashSet<Uuid> = sqlx::query_scalar("SELECT job_id FROM workflow_run")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(
            rows, after,
            "only the requests after the database's offsets were read ({before} before them)"
        );
        stop.cancel();
        running.await.unwrap();
    })
    .await;
}

/// A failover can lose a partition's whole history in the database: its
/// rows and every offset of it, the anchor written before its first batch
/// included (all committed only to the primary), while Kafka kept the
/// group's committed offset and the database still holds the other
/// partitions' offsets. That partition is read again from its start, not
/// resumed at Kafka's offset past the lost requests.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_partition_whose_whole_history_the_database_lost_is_read_again_from_its_start(
    pool: PgPool,
) {
    within_deadline(async {
        let topics = topics().await;
        let engine = support::engine(&pool);
        support::register_greet(&engine).await;
        let producer = producer();
        let mut produced: Vec<(Uuid, i32)> = Vec::new();
        while produced.len() < 12
            || produced
                .iter()
                .map(|(_, p)| *p)
                .collect::<HashSet<_>>()
                .len()
                < usize::try_from(PARTITIONS).unwrap()
        {
            produced.push(produce(&producer, &topics.requests).await);
        }
        let total = i64::try_from(produced.len()).unwrap();
        let (stop, running) = spawn(support::consumer(&engine, &topics));
        wait_rows(&pool, total).await;
        support::wait_committed_to_end(&topics.requests, &topics.group).await;
        stop.cancel();
        running.await.unwrap();

        // The failover: partition `gone` lost everything.
        let gone = produced[0].1;
        let lost: Vec<Uuid> = produced
            .iter()
            .filter(|(_, p)| *p == gone)
            .map(|(id, _)| *id)
            .collect();
        for table in ["workflow_run_outbox", "workflow_run"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE job_id = ANY($1)"))
                .bind(&lost)
                .execute(&pool)
                .await
                .unwrap();
        }
        sqlx::query("DELETE FROM consumer_offset WHERE group_id = $1 AND partition = $2")
            .bind(&topics.group)
            .bind(gone)
            .execute(&pool)
            .await
            .unwrap();

        let (stop, running) = spawn(support::consumer(&engine, &topics));
        wait_rows(&pool, total).await;
        let back: i64 =
            sqlx::query_scalar("SELECT count(*) FROM workflow_run WHERE job_id = ANY($1)")
                .bind(&lost)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(
            back,
            i64::try_from(lost.len()).unwrap(),
            "every lost request is a row again"
        );
        stop.cancel();
        running.await.unwrap();
    })
    .await;
}
