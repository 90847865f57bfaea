//! The relay's read of pending rows: only the head of each job, and a plan
//! whose cost does not grow with the backlog, even on a table the planner
//! knows nothing about yet (never analyzed, as a fresh or busy one is).

use chrono::Utc;
use flotilla_store::outbox::relay::{
    DELETE_PUBLISHED_BEFORE, PENDING_IN_ID_ORDER, analyze_if_stale, mark_published_statement,
    prefer_indexes, publishable,
};
use sqlx::PgPool;

mod support;
use support::prepared_plans;
use uuid::Uuid;

/// `jobs` jobs of five PENDING events each, interleaved as running jobs
/// write them; no ANALYZE.
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

fn all_buckets() -> Vec<i16> {
    (0..64).collect()
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn only_the_lowest_pending_row_of_each_job_is_read(pool: PgPool) {
    backlog(&pool, 50).await;
    // One job has its first two events published, one its first FAILED.
    let (published, failed): (Uuid, Uuid) = sqlx::query_as(
        "SELECT (array_agg(DISTINCT job_id))[1], (array_agg(DISTINCT job_id))[2] FROM workflow_run_outbox",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE workflow_run_outbox SET status = 'PUBLISHED' WHERE job_id = $1 AND sequence <= 2",
    )
    .bind(published)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE workflow_run_outbox SET status = 'FAILED' WHERE job_id = $1 AND sequence = 1",
    )
    .bind(failed)
    .execute(&pool)
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let heads = publishable(&mut conn, &all_buckets(), Utc::now(), 1000)
        .await
        .unwrap()
        .rows;
    assert_eq!(heads.len(), 50, "one row per job");
    for head in &heads {
        let expected = if head.job_id == published {
            3
        } else if head.job_id == failed {
            2 // a FAILED row does not hold the next one back
        } else {
            1
        };
        assert_eq!(head.sequence, expected, "job {}", head.job_id);
    }
    // A smaller limit: fewer heads, and the read says there is more.
    let some = publishable(&mut conn, &all_buckets(), Utc::now(), 7)
        .await
        .unwrap();
    assert!(some.truncated);
    assert!(!some.rows.is_empty() && some.rows.len() <= 7);
    let jobs: std::collections::HashSet<Uuid> = some.rows.iter().map(|r| r.job_id).collect();
    assert_eq!(jobs.len(), some.rows.len(), "still one row per job");
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn the_read_is_one_ordered_index_scan_per_bucket_on_a_table_never_analyzed(pool: PgPool) {
    backlog(&pool, 3000).await;
    sqlx::query("UPDATE workflow_run_outbox SET status = 'PUBLISHED' WHERE sequence <= 2")
        .execute(&pool)
        .await
        .unwrap();
    // Prepared and executed, as the relay's connection runs it.
    let mut tx = pool.begin().await.unwrap();
    prefer_indexes(&mut tx).await.unwrap();
    let buckets: Vec<String> = all_buckets().iter().map(i16::to_string).collect();
    let arguments = format!("ARRAY[{}]::smallint[], 2000, 2000", buckets.join(","));
    for (mode, plan) in prepared_plans(&mut tx, PENDING_IN_ID_ORDER, &arguments).await {
        assert!(
            plan.contains("Index Scan using workflow_run_outbox_pending on workflow_run_outbox"),
            "{mode}: the (bucket, id) index of PENDING rows, in its order:\n{plan}"
        );
        for costly in ["Join", "Sort", "Seq Scan", "Bitmap"] {
            assert!(!plan.contains(costly), "{mode}: no {costly}:\n{plan}");
        }
    }
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn a_table_whose_statistics_lag_is_analyzed_then_marking_reaches_rows_by_key(pool: PgPool) {
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
    // Not the whole outbox.
    marks_by_key(&pool, "Seq Scan on workflow_run_outbox").await;
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn marking_reaches_rows_by_key_before_the_table_is_ever_analyzed(pool: PgPool) {
    // A fresh outbox with a backlog and no statistics: the planner takes
    // the index of PENDING rows for empty, and a plan through it reads the
    // whole backlog per mark (measured: 125 ms for 500 rows of 100,000).
    backlog(&pool, 20_000).await;
    // Not through the backlog's index.
    marks_by_key(&pool, "workflow_run_outbox_pending").await;
}

/// Every plan of the mark reaches its rows by their key, `(job_id,
/// sequence)`, none through `avoided`.
async fn marks_by_key(pool: &PgPool, avoided: &str) {
    for plan in mark_plans(pool).await {
        assert_probes_the_key(&plan);
        assert!(!plan.contains(avoided), "not {avoided}:\n{plan}");
    }
}

/// The keys of `count` rows of the backlog, as SQL arrays.
async fn keys(pool: &PgPool, count: i64) -> (String, String) {
    let keys: Vec<(Uuid, i64)> =
        sqlx::query_as("SELECT job_id, sequence FROM workflow_run_outbox LIMIT $1")
            .bind(count)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(keys.len(), usize::try_from(count).unwrap());
    let jobs: Vec<String> = keys.iter().map(|(job, _)| format!("'{job}'")).collect();
    let sequences: Vec<String> = keys.iter().map(|(_, s)| s.to_string()).collect();
    (
        format!("ARRAY[{}]::uuid[]", jobs.join(",")),
        format!("ARRAY[{}]::bigint[]", sequences.join(",")),
    )
}

/// The plans of a 500-row mark, as the relay runs it (indexes preferred,
/// a prepared statement): the one planned for the values, then the generic
/// one a connection settles on.
async fn mark_plans(pool: &PgPool) -> Vec<String> {
    let (jobs, sequences) = keys(pool, 500).await;
    let arguments = format!("{jobs}, {sequences}, now(), 'relay'");
    let mut tx = pool.begin().await.unwrap();
    prefer_indexes(&mut tx).await.unwrap();
    prepared_plans(&mut tx, &mark_published_statement(), &arguments)
        .await
        .into_iter()
        .map(|(mode, plan)| format!("{mode}:\n{plan}"))
        .collect()
}

#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn retention_reaches_published_rows_by_age_and_deletes_them_by_key(pool: PgPool) {
    backlog(&pool, 20_000).await;
    sqlx::query(
        "UPDATE workflow_run_outbox SET status = 'PUBLISHED', published_at = now() - interval '8 days'
         WHERE sequence <= 2",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut tx = pool.begin().await.unwrap();
    prefer_indexes(&mut tx).await.unwrap();
    for (mode, plan) in prepared_plans(
        &mut tx,
        DELETE_PUBLISHED_BEFORE,
        "now() - interval '7 days', 1000",
    )
    .await
    {
        assert!(
            plan.contains("Index Scan on workflow_run_outbox_published")
                || plan.contains("Index Scan using workflow_run_outbox_published"),
            "{mode}: the oldest through the published rows' index:\n{plan}"
        );
        assert_probes_the_key(&plan);
    }
}

/// `plan` reaches the outbox's rows one probe of the key at a time (an
/// index or bitmap scan of it on the job and sequence, under a nested loop,
/// as the planner likes), never by reading the table.
fn assert_probes_the_key(plan: &str) {
    assert!(
        plan.contains("Nested Loop")
            && plan.contains("workflow_run_outbox_job_id_sequence_key")
            && plan.contains("Index Cond: ((job_id = "),
        "the rows by their key, one probe each:\n{plan}"
    );
    assert!(!plan.contains("Seq Scan"), "no Seq Scan:\n{plan}");
}
