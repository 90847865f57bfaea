//! The relay's reads of the outbox: a batch is every row committed past
//! its bucket's progress, whatever order the transactions committed in,
//! and the plans neither read the published history nor grow with the
//! backlog, even on a table the planner knows nothing about yet (never
//! analyzed, as a fresh or busy one is).

use flotilla_store::outbox::relay::{
    BATCH_ROWS, Batch, DELETE_PUBLISHED_BEFORE, PAGE_ROWS, analyze_if_stale, fetch, plan,
    prefer_indexes,
};
use sqlx::PgPool;

mod support;
use support::prepared_plans;
use uuid::Uuid;

/// `jobs` jobs of five events each, interleaved as running jobs write
/// them, in one transaction; no ANALYZE.
async fn backlog(pool: &PgPool, jobs: i64) {
    sqlx::query(
        "WITH job AS (SELECT gen_random_uuid() AS job_id, n FROM generate_series(1, $1) n),
              row AS (SELECT job.job_id, s.sequence FROM generate_series(1, 5) AS s(sequence), job
                      ORDER BY s.sequence, job.n)
         INSERT INTO workflow_run_outbox (event_id, job_id, sequence, event_type, payload)
         SELECT gen_random_uuid(), job_id, sequence, 'STEP_CHECKPOINT', '{}' FROM row",
    )
    .bind(jobs)
    .execute(pool)
    .await
    .unwrap();
}

/// Moves every bucket's progress past what has committed so far.
async fn publish_everything(pool: &PgPool) {
    sqlx::query("UPDATE relay_bucket SET published = pg_current_snapshot()")
        .execute(pool)
        .await
        .unwrap();
}

/// Moves each batch's bucket to the snapshot the batch ended at.
async fn finish(pool: &PgPool, batches: &[Batch]) {
    for batch in batches {
        sqlx::query("UPDATE relay_bucket SET published = $2::pg_snapshot WHERE bucket = $1")
            .bind(batch.bucket)
            .bind(&batch.to.0)
            .execute(pool)
            .await
            .unwrap();
    }
}

fn all_buckets() -> Vec<i16> {
    (0..64).collect()
}

/// One event of `job` (sequence `sequence`), inserted on `conn`.
async fn insert_one(conn: &mut sqlx::PgConnection, job: Uuid, sequence: i64) {
    sqlx::query(
        "INSERT INTO workflow_run_outbox (event_id, job_id, sequence, event_type, payload)
         VALUES (gen_random_uuid(), $1, $2, 'STEP_CHECKPOINT', '{}')",
    )
    .bind(job)
    .bind(sequence)
    .execute(conn)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_batch_is_what_committed_past_the_progress_in_id_order_and_nothing_published(
    pool: PgPool,
) {
    backlog(&pool, 50).await;
    publish_everything(&pool).await;
    backlog(&pool, 40).await;
    let mut conn = pool.acquire().await.unwrap();
    let batches = plan(&mut conn, &all_buckets()).await.unwrap();
    let planned: Vec<_> = batches
        .iter()
        .flat_map(|b| b.rows.iter().copied())
        .collect();
    assert_eq!(planned.len(), 200, "the second backlog only");
    for batch in &batches {
        assert!(batch.rows.iter().all(|r| r.bucket == batch.bucket));
        assert!(
            batch.rows.windows(2).all(|w| w[0].id < w[1].id),
            "in id order"
        );
    }
    let rows = fetch(&mut conn, &planned).await.unwrap();
    assert_eq!(rows.len(), 200);
    let mut last: std::collections::HashMap<Uuid, i64> = std::collections::HashMap::new();
    for row in &rows {
        let previous = last.insert(row.job_id, row.sequence).unwrap_or(0);
        assert_eq!(
            row.sequence,
            previous + 1,
            "a job's events in sequence order"
        );
    }
    finish(&pool, &batches).await;
    assert!(
        plan(&mut conn, &all_buckets()).await.unwrap().is_empty(),
        "nothing after the progress moved"
    );
}

/// Transactions commit out of the order of their ids: a row of a
/// transaction still open when a batch was planned comes in a later batch,
/// although a younger transaction's row went before it.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_row_committed_after_a_younger_transactions_row_comes_in_the_next_batch(pool: PgPool) {
    let (older, younger) = (Uuid::new_v4(), Uuid::new_v4());
    let mut open = pool.begin().await.unwrap();
    insert_one(&mut open, older, 1).await; // takes its txid first
    let mut conn = pool.acquire().await.unwrap();
    insert_one(&mut conn, younger, 1).await;
    let first = plan(&mut conn, &all_buckets()).await.unwrap();
    let jobs = |batches: &[Batch]| -> Vec<Uuid> {
        batches
            .iter()
            .flat_map(|b| b.rows.iter().map(|r| r.job_id))
            .collect()
    };
    assert_eq!(jobs(&first), [younger]);
    finish(&pool, &first).await;
    open.commit().await.unwrap();
    let second = plan(&mut conn, &all_buckets()).await.unwrap();
    assert_eq!(
        jobs(&second),
        [older],
        "the older transaction's row is not lost"
    );
    finish(&pool, &second).await;
    assert!(plan(&mut conn, &all_buckets()).await.unwrap().is_empty());
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn the_reads_go_through_the_txid_index_on_a_table_never_analyzed(pool: PgPool) {
    backlog(&pool, 3000).await;
    publish_everything(&pool).await;
    backlog(&pool, 200).await;
    let progress: String =
        sqlx::query_scalar("SELECT published::text FROM relay_bucket WHERE bucket = 0")
            .fetch_one(&pool)
            .await
            .unwrap();
    // Prepared and executed, as the relay's connection runs them.
    let mut tx = pool.begin().await.unwrap();
    prefer_indexes(&mut tx).await.unwrap();
    let buckets: Vec<String> = all_buckets().iter().map(i16::to_string).collect();
    let progresses: Vec<String> = all_buckets()
        .iter()
        .map(|_| format!("'{progress}'"))
        .collect();
    let arguments = format!(
        "ARRAY[{}]::smallint[], ARRAY[{}]::text[], pg_current_snapshot()",
        buckets.join(","),
        progresses.join(",")
    );
    for (mode, plan) in prepared_plans(&mut tx, BATCH_ROWS, &arguments).await {
        assert!(
            plan.contains("workflow_run_outbox_by_txid"),
            "{mode}: a range of the (bucket, txid, id) index per bucket:\n{plan}"
        );
        for costly in ["Seq Scan", "Hash Join"] {
            assert!(!plan.contains(costly), "{mode}: no {costly}:\n{plan}");
        }
    }
    let page: Vec<(i16, String, i64)> = sqlx::query_as(
        "SELECT bucket, txid::text, id FROM workflow_run_outbox ORDER BY id DESC LIMIT 500",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let list = |f: &dyn Fn(&(i16, String, i64)) -> String| {
        page.iter().map(f).collect::<Vec<_>>().join(",")
    };
    let arguments = format!(
        "ARRAY[{}]::smallint[], ARRAY[{}]::int8[], ARRAY[{}]::int8[]",
        list(&|r| r.0.to_string()),
        list(&|r| r.1.clone()),
        list(&|r| r.2.to_string())
    );
    for (mode, plan) in prepared_plans(&mut tx, PAGE_ROWS, &arguments).await {
        assert!(
            plan.contains("Nested Loop") && plan.contains("workflow_run_outbox_by_txid"),
            "{mode}: one probe of the index per row:\n{plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{mode}: no Seq Scan:\n{plan}");
    }
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_table_whose_statistics_lag_is_analyzed_once(pool: PgPool) {
    let analyzed = || async {
        let mut tx = pool.begin().await.unwrap();
        let analyzed = analyze_if_stale(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
        analyzed.expect("no other relay holds the lock")
    };
    assert!(!analyzed().await, "an empty table is not stale");
    backlog(&pool, 20_000).await;
    // pg_stat counts rows a moment after the inserting transaction ends.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !analyzed().await {
        assert!(std::time::Instant::now() < deadline, "never found stale");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(!analyzed().await, "once analyzed, not again");
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn retention_reaches_published_rows_through_the_txid_index(pool: PgPool) {
    backlog(&pool, 20_000).await;
    sqlx::query("UPDATE workflow_run_outbox SET created_at = now() - interval '8 days'")
        .execute(&pool)
        .await
        .unwrap();
    publish_everything(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    prefer_indexes(&mut tx).await.unwrap();
    for (mode, plan) in prepared_plans(
        &mut tx,
        DELETE_PUBLISHED_BEFORE,
        "now() - interval '7 days', 16",
    )
    .await
    {
        assert!(
            plan.contains("workflow_run_outbox_by_txid"),
            "{mode}: each bucket's oldest through the (bucket, txid, id) index:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan on workflow_run_outbox "),
            "{mode}: no Seq Scan:\n{plan}"
        );
    }
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let deleted = flotilla_store::outbox::relay::delete_published_before(
        &mut tx,
        chrono::Utc::now() - chrono::TimeDelta::days(7),
        16,
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(deleted, Some(64 * 16), "16 of each bucket's oldest");
}
