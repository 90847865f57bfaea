//! The group commit against a real database: batching, fencing, an
//! ambiguous commit.

use super::*;
use flotilla_store::runs::{Checkpoint, CheckpointLayout};

fn committer(pool: &PgPool) -> GroupCommit {
    GroupCommit::new(
        pool.clone(),
        Duration::from_secs(5),
        Doorbell::new(pool.clone()),
        None,
    )
}

/// The fence of a row as [`running`] made it.
fn fence(token: Uuid) -> Fence {
    Fence {
        token,
        sequence: 0,
        revision: 0,
    }
}

/// A RUNNING row leased with `token`.
async fn running(pool: &PgPool, token: Uuid) -> Uuid {
    let job_id = Uuid::new_v4();
    flotilla_store::sql::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest,
             status, max_attempts, attempt, lease_owner, lease_token, lease_until)
         VALUES ($1, 'shared', '{}', '{}', 'd', 'RUNNING', 3, 1, 'w', $2, now() + interval '1 minute')",
    )
    .bind(job_id)
    .bind(token)
    .execute(pool)
    .await
    .unwrap();
    job_id
}

fn checkpoint(response: serde_json::Value, layout: CheckpointLayout) -> Transition {
    Transition::Checkpoint {
        checkpoint: Checkpoint {
            name: "one".into(),
            skipped: false,
            item: None,
            page: None,
            signal: None,
            child: None,
            list: None,
            timed_out: false,
            call: None,
            poll: None,
            response,
        },
        layout,
    }
}

/// The job's rows in `table`.
async fn count(pool: &PgPool, table: &str, job_id: Uuid) -> i64 {
    flotilla_store::sql::query_scalar(&format!("SELECT count(*) FROM {table} WHERE job_id = $1"))
        .bind(job_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Four writers at once: the first commits alone, the other three share
/// a transaction; of those, one lost its lease and one carries a value
/// Postgres refuses. Each gets its own outcome, and the good ones are
/// written, checkpoint rows included.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn writers_sharing_a_commit_each_get_their_own_outcome(pool: PgPool) {
    let group = committer(&pool);
    let token = Uuid::new_v4();
    let first = running(&pool, token).await;
    let good = running(&pool, token).await;
    let lost = running(&pool, Uuid::new_v4()).await;
    let refused = running(&pool, token).await;
    let now = Utc::now();
    let ok = serde_json::json!({"ok": true});
    let rows = CheckpointLayout::Rows;
    let (a, b, c, d) = tokio::join!(
        group.write(first, fence(token), now, checkpoint(ok.clone(), rows)),
        group.write(good, fence(token), now, checkpoint(ok.clone(), rows)),
        group.write(lost, fence(token), now, checkpoint(ok.clone(), rows)),
        // JSONB cannot hold a NUL character.
        group.write(
            refused,
            fence(token),
            now,
            checkpoint(serde_json::json!({"bad": "\u{0}"}), rows)
        ),
    );
    assert_eq!(a.unwrap(), Written::Done, "written alone");
    assert_eq!(
        b.unwrap(),
        Written::Done,
        "written beside the others' failures"
    );
    assert_eq!(
        c.unwrap(),
        Written::Lost,
        "the lost lease answers only its writer"
    );
    let refusal = d.expect_err("refused");
    assert!(refusal.is_about_the_data(), "{refusal}");
    for (job, expected) in [(first, 1), (good, 1), (lost, 0), (refused, 0)] {
        assert_eq!(
            count(&pool, "workflow_run_outbox", job).await,
            expected,
            "{job}"
        );
        assert_eq!(
            count(&pool, "workflow_run_checkpoint", job).await,
            expected,
            "{job}"
        );
    }
}

/// Under load, many writes share one commit.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn concurrent_writes_share_commits(pool: PgPool) {
    let group = committer(&pool);
    let token = Uuid::new_v4();
    let mut jobs = Vec::new();
    for _ in 0..40 {
        jobs.push(running(&pool, token).await);
    }
    // Every kind of commit point, side by side.
    let change = |n: usize| match n % 4 {
        0 => checkpoint(serde_json::json!({"n": 1}), CheckpointLayout::Array),
        1 => Transition::Park {
            step: "approve".into(),
            timers: None,
            signals: Vec::new(),
            children: Vec::new(),
            replies: flotilla_store::runs::step_requests::AwaitedReplies::default(),
            wakes_at: None,
        },
        2 => Transition::Fail {
            error: "refused".into(),
            verdict: Some("no".into()),
        },
        _ => Transition::Complete {
            result: serde_json::json!({}),
            verdict: "done".into(),
        },
    };
    let writes = jobs
        .iter()
        .enumerate()
        .map(|(n, job)| group.write(*job, fence(token), Utc::now(), change(n)));
    let outcomes = futures_util::future::join_all(writes).await;
    assert!(outcomes.into_iter().all(|o| o.unwrap() == Written::Done));
    for (n, job) in jobs.iter().enumerate() {
        assert_eq!(count(&pool, "workflow_run_outbox", *job).await, 1);
        let status: String =
            flotilla_store::sql::query_scalar("SELECT status FROM workflow_run WHERE job_id = $1")
                .bind(job)
                .fetch_one(&pool)
                .await
                .unwrap();
        let expected = ["RUNNING", "WAITING", "FAILED", "COMPLETED"][n % 4];
        assert_eq!(status, expected, "{job}");
    }
    let batches = group.0.server_ref().batches.load(Ordering::Relaxed);
    assert!(batches <= 5, "40 writes took {batches} commits");
}

/// A shared commit that commits and then reports a failure (a
/// connection reset after the server wrote the commit record): every
/// writer hears "outcome unknown", nothing is redone, and each job has
/// exactly one checkpoint and one event. The same checkpoint written
/// again by its holder matches nothing: the sequence moved on.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn an_ambiguous_commit_is_never_redone(pool: PgPool) {
    let group = committer(&pool);
    let token = Uuid::new_v4();
    let mut jobs = Vec::new();
    for _ in 0..8 {
        jobs.push(running(&pool, token).await);
    }
    group.faults().fail_after_commit(u32::MAX);
    let rows = CheckpointLayout::Rows;
    let writes = jobs.iter().map(|job| {
        group.write(
            *job,
            fence(token),
            Utc::now(),
            checkpoint(serde_json::json!({}), rows),
        )
    });
    let outcomes = futures_util::future::join_all(writes).await;
    for outcome in outcomes {
        let error = outcome.expect_err("the commit's outcome is unknown");
        assert!(matches!(error, StoreError::OutcomeUnknown(_)), "{error}");
    }
    group.faults().fail_after_commit(0);
    for job in &jobs {
        assert_eq!(count(&pool, "workflow_run_outbox", *job).await, 1, "{job}");
        assert_eq!(
            count(&pool, "workflow_run_checkpoint", *job).await,
            1,
            "{job}"
        );
        let again = group
            .write(
                *job,
                fence(token),
                Utc::now(),
                checkpoint(serde_json::json!({}), rows),
            )
            .await;
        assert!(
            again.unwrap() == Written::Lost,
            "a repeat at the old sequence appends nothing"
        );
        assert_eq!(
            count(&pool, "workflow_run_checkpoint", *job).await,
            1,
            "{job}"
        );
    }
}

/// A checkpoint named `name` answering `n`.
fn named_checkpoint(name: &str, n: i64) -> Checkpoint {
    Checkpoint {
        name: name.into(),
        skipped: false,
        item: None,
        page: None,
        signal: None,
        child: None,
        list: None,
        timed_out: false,
        call: None,
        poll: None,
        response: serde_json::json!({ "n": n }),
    }
}

/// The last step's checkpoint and the completion share one write: the
/// STEP_CHECKPOINT and COMPLETED events take the next two sequences;
/// the same write again at the old sequence writes nothing. Where the
/// checkpoint goes follows the run, not the engine's layout: a run with
/// no checkpoint row yet (a 1-step job, or one whose earlier
/// checkpoints are in its array) keeps it in its array, which the
/// completion rewrites anyway, instead of a row and an index entry of
/// its own; a run that has rows gets one more, after them.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn the_last_checkpoint_and_the_completion_are_one_write(pool: PgPool) {
    let group = committer(&pool);
    for earlier in [
        None,
        Some(CheckpointLayout::Array),
        Some(CheckpointLayout::Rows),
    ] {
        let token = Uuid::new_v4();
        let job = running(&pool, token).await;
        let mut at = fence(token);
        let mut names = vec![];
        if let Some(layout) = earlier {
            let first = Transition::Checkpoint {
                checkpoint: named_checkpoint("first", 1),
                layout,
            };
            assert!(
                group
                    .write(job, at, Utc::now(), first)
                    .await
                    .unwrap()
                    .is_written()
            );
            at.sequence += 1;
            names.push("first");
        }
        names.push("last");
        let change = || Transition::CheckpointAndComplete {
            checkpoint: named_checkpoint("last", 3),
            result: serde_json::json!({"total": 3}),
            verdict: "done".into(),
        };
        assert!(
            group
                .write(job, at, Utc::now(), change())
                .await
                .unwrap()
                .is_written()
        );
        let (status, sequence): (String, i64) = flotilla_store::sql::query_as(
            "SELECT status, event_sequence FROM workflow_run WHERE job_id = $1",
        )
        .bind(job)
        .fetch_one(&pool)
        .await
        .unwrap();
        let last = at.sequence + 2;
        assert_eq!(
            (status.as_str(), sequence),
            ("COMPLETED", last),
            "{earlier:?}"
        );
        let events: Vec<(i64, String)> = flotilla_store::sql::query_as(
            "SELECT sequence, event_type FROM workflow_run_outbox WHERE job_id = $1 ORDER BY sequence",
        )
        .bind(job)
        .fetch_all(&pool)
        .await
        .unwrap();
        let mut expected: Vec<(i64, String)> = (1..last)
            .map(|sequence| (sequence, "STEP_CHECKPOINT".to_owned()))
            .collect();
        expected.push((last, "COMPLETED".into()));
        assert_eq!(events, expected, "{earlier:?}");
        let read = {
            let mut conn = pool.acquire().await.unwrap();
            flotilla_store::runs::get(&mut conn, job)
                .await
                .unwrap()
                .unwrap()
        };
        let listed: Vec<&str> = read
            .checkpoints
            .0
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(listed, names, "every checkpoint, in order: {earlier:?}");
        let rows: Vec<i64> = flotilla_store::sql::query_scalar(
            "SELECT event_sequence FROM workflow_run_checkpoint WHERE job_id = $1 ORDER BY 1",
        )
        .bind(job)
        .fetch_all(&pool)
        .await
        .unwrap();
        let expected_rows: Vec<i64> = if earlier == Some(CheckpointLayout::Rows) {
            vec![1, 2]
        } else {
            vec![]
        };
        assert_eq!(rows, expected_rows, "{earlier:?}");
        assert!(
            group.write(job, at, Utc::now(), change()).await.unwrap() == Written::Lost,
            "a repeat at the old sequence writes nothing"
        );
        assert_eq!(
            count(&pool, "workflow_run_outbox", job).await,
            i64::try_from(expected.len()).unwrap()
        );
    }
}

/// Rows locked by a foreign session (an operator's open `SELECT … FOR
/// UPDATE` over several of them) fail their own writes: the first after
/// the reserved connections' lock timeout (a tenth of the lease), the
/// others at once (the batch's rows are then locked first, skipping
/// held ones); the other writes of the batch commit, within the batch's
/// bound (a third of the lease), and no writer waits for the lock holder.
#[sqlx::test(migrator = "flotilla_store::MIGRATOR")]
async fn rows_locked_by_a_foreign_session_fail_only_their_own_writes(pool: PgPool) {
    let mut settings = crate::EngineSettings::new("w");
    settings.lease = Duration::from_secs(2);
    let reserved = crate::run::reserved::reserved_pool(&pool, &settings);
    let group = GroupCommit::new(
        reserved,
        settings.lease / 3,
        Doorbell::new(pool.clone()),
        None,
    );
    let token = Uuid::new_v4();
    let mut jobs = Vec::new();
    for _ in 0..8 {
        jobs.push(running(&pool, token).await);
    }
    jobs.sort();
    let blocked: Vec<Uuid> = jobs.iter().step_by(2).copied().collect();
    let mut operator = pool.begin().await.unwrap();
    flotilla_store::sql::query("SELECT 1 FROM workflow_run WHERE job_id = ANY($1) FOR UPDATE")
        .bind(&blocked)
        .execute(&mut *operator)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let writes = jobs.iter().map(|job| {
        group.write(
            *job,
            fence(token),
            Utc::now(),
            checkpoint(serde_json::json!({}), CheckpointLayout::Array),
        )
    });
    let outcomes = futures_util::future::join_all(writes).await;
    let waited = started.elapsed();
    for (job, outcome) in jobs.iter().zip(outcomes) {
        if blocked.contains(job) {
            let error = outcome.expect_err("a locked row's write fails");
            assert!(error.is_a_blocked_row(), "{error}");
        } else {
            assert!(
                outcome.unwrap().is_written(),
                "{job} written beside the blocked rows"
            );
        }
    }
    assert!(
        waited < Duration::from_secs(2),
        "the writers waited {waited:?}"
    );
    operator.rollback().await.unwrap();
    for job in &jobs {
        let expected = i64::from(!blocked.contains(job));
        assert_eq!(
            count(&pool, "workflow_run_outbox", *job).await,
            expected,
            "{job}"
        );
    }
}

/// With the database out of reach, a batch of waiting writers is
/// answered at once with the one failure, not written again one by one
/// (each waiting for a connection in turn).
#[tokio::test]
async fn after_an_outage_every_waiting_writer_is_answered_at_once() {
    let unreachable = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:1/none")
        .unwrap();
    let group = GroupCommit::new(
        unreachable.clone(),
        Duration::from_secs(5),
        Doorbell::new(unreachable),
        None,
    );
    let token = Uuid::new_v4();
    let started = std::time::Instant::now();
    let writes = (0..20).map(|_| {
        group.write(
            Uuid::new_v4(),
            fence(token),
            Utc::now(),
            checkpoint(serde_json::json!({}), CheckpointLayout::Array),
        )
    });
    let outcomes = futures_util::future::join_all(writes).await;
    let waited = started.elapsed();
    assert!(outcomes.iter().all(Result::is_err));
    assert!(
        waited < Duration::from_secs(2),
        "20 writers answered after {waited:?}"
    );
}
