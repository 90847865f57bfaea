//! Hostile values one layer below the wire: what the store refuses stays
//! with its own submission or row and stops nothing else.

use std::time::Duration;

use flotilla_store::{Clock as _, RunStatus};
use flotilla_worker::engine::{RefusalMode, SubmitError, Submitted};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{self, Calls, echo_targets, engine, manual_clock, row, rows, stored};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

#[sqlx::test(migrator = "MIGRATOR")]
async fn unstorable_submissions_are_refused_naming_the_field_before_anything_is_written(
    pool: PgPool,
) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    engine
        .register_workflow(&support::three_steps("safe", "echo"))
        .await
        .unwrap();
    let cases = [
        (stored(Uuid::nil(), "safe", json!({"n": 1})), "job_id"),
        (
            stored(Uuid::new_v4(), "safe", json!({"n": 1, "note": "a\u{0}b"})),
            "input.note",
        ),
        (
            stored(Uuid::new_v4(), "sa\u{0}fe", json!({"n": 1})),
            "workflow_name",
        ),
        (
            stored(Uuid::new_v4(), &"w".repeat(5000), json!({"n": 1})),
            "workflow_name",
        ),
    ];
    for (submission, field) in cases {
        for mode in [RefusalMode::Refuse, RefusalMode::Record] {
            match engine.submit(submission.clone(), mode).await {
                Err(SubmitError::Unstorable(unstorable)) => assert_eq!(unstorable.field, field),
                other => panic!("{field}: expected Unstorable, got {other:?}"),
            }
        }
    }
    assert_eq!(rows(&pool).await, 0, "nothing was written");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_malformed_traceparent_is_dropped_and_the_job_still_runs(pool: PgPool) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    engine
        .register_workflow(&support::three_steps("traced", "echo"))
        .await
        .unwrap();
    let mut submission = stored(Uuid::new_v4(), "traced", json!({"n": 1}));
    submission.traceparent = Some("00-not-a-trace\u{0}".into());
    let job_id = submission.job_id;
    engine
        .submit(submission, RefusalMode::Refuse)
        .await
        .unwrap();
    let stored = row(&pool, job_id).await;
    assert_eq!(
        (stored.status, stored.traceparent),
        (RunStatus::Queued, None)
    );
}

/// A `tracestate` the store could not hold (a NUL) or that has no
/// `traceparent` to go with is dropped; the job runs, and a good one beside
/// it keeps its own.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_malformed_or_orphan_tracestate_is_dropped_and_the_job_still_runs(pool: PgPool) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    engine
        .register_workflow(&support::three_steps("traced", "echo"))
        .await
        .unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let cases = [
        (Some(traceparent), "vendor=a\u{0}b", None),
        (None, "vendor=orphan", None),
        (Some(traceparent), "vendor=fine", Some("vendor=fine")),
    ];
    for (parent, state, kept) in cases {
        let mut submission = stored(Uuid::new_v4(), "traced", json!({"n": 1}));
        submission.traceparent = parent.map(str::to_owned);
        submission.tracestate = Some(state.to_owned());
        let job_id = submission.job_id;
        engine
            .submit(submission, RefusalMode::Refuse)
            .await
            .unwrap();
        let stored = row(&pool, job_id).await;
        assert_eq!(
            (
                stored.status,
                stored.traceparent.as_deref(),
                stored.tracestate.as_deref()
            ),
            (RunStatus::Queued, parent, kept),
            "{state:?}"
        );
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_request_the_database_refuses_fails_alone_and_the_rest_of_its_batch_commits(
    pool: PgPool,
) {
    // A constraint of this test's own database stands in for any content
    // the store refuses that no check before writing caught.
    sqlx::query("ALTER TABLE workflow_run ADD CONSTRAINT test_refuses_poison CHECK (input->>'poison' IS NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    engine
        .register_workflow(&support::three_steps("batched", "echo"))
        .await
        .unwrap();
    let good = |n| stored(Uuid::new_v4(), "batched", json!({"n": n}));
    let poison = stored(Uuid::new_v4(), "batched", json!({"n": 2, "poison": "yes"}));
    let results = engine
        .submit_batch(vec![
            good(1),
            poison,
            good(3),
            stored(Uuid::nil(), "batched", json!({})),
        ])
        .await
        .expect("a data error is not an outage");
    assert!(matches!(results[0], Ok(Submitted::Created(_))));
    match &results[1] {
        Err(SubmitError::Unstorable(unstorable)) => assert!(
            unstorable.reason.contains("test_refuses_poison"),
            "the reason names the database's refusal: {unstorable}"
        ),
        other => panic!("expected Unstorable, got {other:?}"),
    }
    assert!(matches!(results[2], Ok(Submitted::Created(_))));
    assert!(matches!(&results[3], Err(SubmitError::Unstorable(u)) if u.field == "job_id"));
    assert_eq!(rows(&pool).await, 2);
    let accepted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workflow_run_outbox WHERE event_type = 'ACCEPTED'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        accepted, 2,
        "each row with its event, nothing for the refused ones"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn the_schema_refuses_the_nil_job_id(pool: PgPool) {
    let refused = sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest, status, max_attempts)
         VALUES ('00000000-0000-0000-0000-000000000000', 'w', '{}', '{}', 'd', 'QUEUED', 3)",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    assert!(
        refused.to_string().contains("workflow_run_job_id_not_nil"),
        "{refused}"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_sweep_next_to_a_row_that_cannot_be_settled_still_requeues_the_others(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&support::three_steps("swept", "echo"))
        .await
        .unwrap();
    let healthy = support::submit(&engine, "swept", json!({"n": 1})).await;
    // A row written by another version: its blank name makes its DEAD event
    // break the contract, so its third lapse in a row can never be settled.
    let broken = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest, status,
             attempt, max_attempts, lease_owner, lease_token, lease_until, lease_losses, created_at)
         VALUES ($1, ' ', '{}', '{}', 'd', 'RUNNING', 1, 1, 'gone', gen_random_uuid(), $2, 2, $2)",
    )
    .bind(broken)
    .bind(clock.now() - chrono::TimeDelta::hours(1))
    .execute(&pool)
    .await
    .unwrap();
    let claimed = engine
        .claim()
        .await
        .unwrap()
        .expect("the healthy job is claimable");
    assert_eq!(claimed.job_id(), healthy);
    drop(claimed); // its worker dies: the lease lapses
    clock.advance(Duration::from_secs(120));

    assert_eq!(engine.sweep().await.unwrap(), 1, "the healthy job is swept");
    assert_eq!(row(&pool, healthy).await.status, RunStatus::Queued);
    let stuck = row(&pool, broken).await;
    assert_eq!(
        stuck.status,
        RunStatus::Running,
        "nothing half-written for the broken row"
    );
    assert!(
        stuck.lease_until.unwrap() > clock.now(),
        "the broken row waits behind the others"
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_external_response_the_store_cannot_hold_is_refused_before_the_job_is_touched(
    pool: PgPool,
) {
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    let refused = engine
        .complete_step(
            Uuid::new_v4(),
            "approve",
            json!({"ok": true, "note": "\u{0}"}),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, flotilla_worker::engine::CompleteError::Unstorable(u) if u.field == "response.note"),
        "{refused:?}"
    );
}

/// A database migrated up to just before the nil-id check, holding one
/// row with the nil job id in `status` (written the way a release of that
/// time could) and its ACCEPTED event, then migrated to the end.
async fn migrated_past_a_nil_row(pool: &PgPool, status: &str) {
    let nil_check = 20_261_130_000_001;
    let earlier = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            MIGRATOR
                .iter()
                .filter(|m| m.version < nil_check)
                .cloned()
                .collect(),
        ),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    earlier.run(pool).await.unwrap();
    // A month before the tests' manual clock starts.
    let long_ago = manual_clock().now() - chrono::TimeDelta::days(30);
    sqlx::query(
        "INSERT INTO workflow_run (job_id, workflow_name, definition, input, request_digest,
             status, max_attempts, run_after, created_at, lease_owner, lease_token, lease_until)
         VALUES ('00000000-0000-0000-0000-000000000000', 'old', '{}', '{}', 'd', $1, 3, $2, $2,
             CASE WHEN $1 = 'RUNNING' THEN 'gone' END,
             CASE WHEN $1 = 'RUNNING' THEN gen_random_uuid() END,
             CASE WHEN $1 = 'RUNNING' THEN $2 END)",
    )
    .bind(status)
    .bind(long_ago)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO workflow_run_outbox (event_id, job_id, sequence, event_type, payload)
         VALUES (gen_random_uuid(), '00000000-0000-0000-0000-000000000000', 1, 'ACCEPTED', '{}')",
    )
    .execute(pool)
    .await
    .unwrap();
    MIGRATOR.run(pool).await.unwrap();
    for table in ["workflow_run_set_aside", "workflow_run_outbox_set_aside"] {
        let set_aside: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(set_aside, 1, "{table}");
    }
}

/// A QUEUED row with the nil job id, the oldest in the queue, made every
/// claim statement fail under the NOT VALID check (the claim's UPDATE of
/// it is refused): the migration sets it aside and the queue moves.
#[sqlx::test(migrations = false)]
async fn a_queued_nil_id_row_an_earlier_release_wrote_does_not_stop_the_claims(pool: PgPool) {
    migrated_past_a_nil_row(&pool, "QUEUED").await;
    let engine = engine(&pool, echo_targets(&Calls::default()), manual_clock(), "w");
    engine
        .register_workflow(&support::three_steps("after", "echo"))
        .await
        .unwrap();
    let job_id = support::submit(&engine, "after", json!({"n": 1})).await;
    let claimed = engine.claim().await.expect("the claim works");
    assert_eq!(claimed.expect("the new job").job_id(), job_id);
}

/// A RUNNING row with the nil job id and a lapsed lease stopped every
/// sweeper pass (neither its settling nor its deferral could be written):
/// the migration sets it aside and the others are swept.
#[sqlx::test(migrations = false)]
async fn a_lapsed_nil_id_row_an_earlier_release_wrote_does_not_stop_the_sweeper(pool: PgPool) {
    migrated_past_a_nil_row(&pool, "RUNNING").await;
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&support::three_steps("after", "echo"))
        .await
        .unwrap();
    support::submit(&engine, "after", json!({"n": 1})).await;
    drop(engine.claim().await.unwrap().expect("the new job"));
    clock.advance(Duration::from_secs(120));
    assert_eq!(engine.sweep().await.expect("the sweep works"), 1);
}

/// A lapsed row that refuses even its deferral (here a trigger refuses
/// every update of it, as a check would) is logged and skipped: the pass
/// goes on and settles the rows behind it.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_lapsed_row_that_refuses_its_deferral_is_skipped_not_the_end_of_the_pass(pool: PgPool) {
    let clock = manual_clock();
    let engine = engine(&pool, echo_targets(&Calls::default()), clock.clone(), "w");
    engine
        .register_workflow(&support::three_steps("swept", "echo"))
        .await
        .unwrap();
    let stubborn = support::submit(&engine, "swept", json!({"n": 1})).await;
    drop(engine.claim().await.unwrap().expect("the first job"));
    let healthy = support::submit(&engine, "swept", json!({"n": 2})).await;
    clock.advance(Duration::from_secs(1));
    drop(engine.claim().await.unwrap().expect("the second job"));
    for statement in [
        "CREATE FUNCTION refuse_stubborn() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'check_violation'; END $$"
            .to_owned(),
        format!(
            "CREATE TRIGGER refuse_stubborn BEFORE UPDATE ON workflow_run
             FOR EACH ROW WHEN (OLD.job_id = '{stubborn}') EXECUTE FUNCTION refuse_stubborn()"
        ),
    ] {
        sqlx::query(&statement).execute(&pool).await.unwrap();
    }
    clock.advance(Duration::from_secs(120));
    assert_eq!(engine.sweep().await.expect("the pass goes on"), 1);
    assert_eq!(row(&pool, healthy).await.status, RunStatus::Queued);
    assert_eq!(row(&pool, stubborn).await.status, RunStatus::Running);
}
