//! Parking on external steps, complete-step, and the operator verbs.

use flotilla_contracts::WorkflowRunEventType as E;
use flotilla_store::RunStatus;
use flotilla_worker::engine::{
    Cancelled, CompleteError, CompleteOutcome, Engine, OperatorError, Outcome,
};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{self, Calls, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// prepare (echo) → approve (external, must say approved) → notify (echo),
/// checkpoints in the row's array.
async fn approval_engine(pool: &PgPool, calls: &Calls) -> Engine {
    support::approval_engine(pool, calls, false).await
}

async fn parked_job(engine: &Engine) -> Uuid {
    let job_id = submit(engine, "approval", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    job_id
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn an_external_step_parks_the_job_and_complete_step_resumes_it(pool: PgPool) {
    let calls = Calls::default();
    let engine = approval_engine(&pool, &calls).await;
    let job_id = parked_job(&engine).await;
    let waiting = row(&pool, job_id).await;
    assert_eq!(waiting.status, RunStatus::Waiting);
    assert_eq!(waiting.outstanding_step.as_deref(), Some("approve"));
    assert_eq!(waiting.lease_token, None);
    assert_eq!(
        calls.of(job_id),
        ["prepare"],
        "the external step is not invoked"
    );
    assert_eq!(
        engine.run_once().await.unwrap(),
        Outcome::Idle,
        "a WAITING job is not claimable"
    );

    let outcome = engine
        .complete_step(job_id, "approve", json!({"approved": true, "by": "ada"}))
        .await
        .unwrap();
    assert_eq!(outcome, CompleteOutcome::Completed);
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Queued);
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
    assert_eq!(calls.of(job_id), ["prepare", "notify"]);
    assert_eq!(
        row(&pool, job_id).await.result.unwrap().0["request"],
        json!({"by": "ada"})
    );
    assert_eq!(
        support::event_types(&pool, job_id).await,
        [
            E::Accepted,
            E::StepCheckpoint,
            E::Waiting,
            E::StepCheckpoint,
            E::StepCheckpoint,
            E::Completed
        ]
    );
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn concurrent_completions_give_one_completed_and_one_already_done(pool: PgPool) {
    for checkpoint_rows in [false, true] {
        let engine = support::approval_engine(&pool, &Calls::default(), checkpoint_rows).await;
        concurrent_completions(&pool, &engine).await;
    }
}

/// Two answers at once to each of five parked jobs: the second waits for
/// the first one's lock and must then see its checkpoint.
async fn concurrent_completions(pool: &PgPool, engine: &Engine) {
    for _ in 0..5 {
        let job_id = parked_job(engine).await;
        let response = json!({"approved": true, "by": "ada"});
        let (a, b) = tokio::join!(
            engine.complete_step(job_id, "approve", response.clone()),
            engine.complete_step(job_id, "approve", response.clone()),
        );
        let mut outcomes = [a.unwrap(), b.unwrap()];
        outcomes.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(
            outcomes,
            [CompleteOutcome::AlreadyDone, CompleteOutcome::Completed]
        );
        let checkpoints = row(pool, job_id).await.checkpoints.0;
        assert_eq!(
            checkpoints.as_array().unwrap().len(),
            2,
            "one checkpoint for the external step"
        );
        // A later repeat is still AlreadyDone, also once the job ran on.
        assert_eq!(engine.run_once().await.unwrap(), Outcome::Completed(job_id));
        assert_eq!(
            engine
                .complete_step(job_id, "approve", response)
                .await
                .unwrap(),
            CompleteOutcome::AlreadyDone
        );
    }
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn complete_step_on_another_state_or_step_is_wrong_state(pool: PgPool) {
    let engine = approval_engine(&pool, &Calls::default()).await;
    let job_id = parked_job(&engine).await;
    let wrong_step = engine
        .complete_step(job_id, "notify", json!({}))
        .await
        .unwrap();
    assert_eq!(
        wrong_step,
        CompleteOutcome::WrongState {
            status: RunStatus::Waiting,
            outstanding_step: Some("approve".into())
        }
    );
    // A non-external step that has a checkpoint is not AlreadyDone either.
    let prepared = engine
        .complete_step(job_id, "prepare", json!({}))
        .await
        .unwrap();
    assert!(
        matches!(prepared, CompleteOutcome::WrongState { .. }),
        "{prepared:?}"
    );

    let queued = submit(&engine, "approval", json!({})).await;
    let claimed = engine.claim().await.unwrap().unwrap();
    assert_eq!(claimed.job_id(), queued);
    let running = engine
        .complete_step(queued, "approve", json!({"approved": true}))
        .await
        .unwrap();
    assert_eq!(
        running,
        CompleteOutcome::WrongState {
            status: RunStatus::Running,
            outstanding_step: None
        }
    );

    let unknown = Uuid::new_v4();
    assert!(matches!(
        engine.complete_step(unknown, "approve", json!({})).await,
        Err(CompleteError::NotFound(id)) if id == unknown
    ));
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn a_rejected_external_response_fails_the_job_as_a_verdict(pool: PgPool) {
    let engine = approval_engine(&pool, &Calls::default()).await;
    let refused = parked_job(&engine).await;
    let outcome = engine
        .complete_step(refused, "approve", json!({"approved": false}))
        .await
        .unwrap();
    assert_eq!(
        outcome,
        CompleteOutcome::Rejected {
            violations: vec!["approve: response.approved == true".into()]
        }
    );
    let failed = row(&pool, refused).await;
    assert_eq!(failed.status, RunStatus::Failed);
    assert_eq!(
        failed.verdict.as_deref(),
        Some("approve: response.approved == true")
    );
    assert_eq!(
        support::event_types(&pool, refused).await.last(),
        Some(&E::Failed)
    );

    let malformed = parked_job(&engine).await;
    let outcome = engine
        .complete_step(malformed, "approve", json!({"by": "nobody"}))
        .await
        .unwrap();
    let CompleteOutcome::Rejected { violations } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(violations[0].contains("output schema"), "{violations:?}");
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn operators_cancel_waiting_jobs_and_retry_failed_ones(pool: PgPool) {
    let calls = Calls::default();
    let engine = approval_engine(&pool, &calls).await;
    let job_id = parked_job(&engine).await;

    let Cancelled::Done(cancelled) = engine.cancel(job_id, "customer withdrew").await.unwrap()
    else {
        panic!("a waiting job is cancelled at once")
    };
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    assert_eq!(cancelled.error.as_deref(), Some("customer withdrew"));
    let events = support::events(&pool, job_id).await;
    assert_eq!(events.last().unwrap().event_type(), E::Cancelled);
    assert_eq!(events.last().unwrap().error(), Some("customer withdrew"));
    assert!(matches!(
        engine.cancel(job_id, "again").await,
        Err(OperatorError::WrongState {
            status: RunStatus::Cancelled,
            ..
        })
    ));

    let retried = engine.retry(job_id).await.unwrap();
    assert_eq!(
        (retried.status, retried.attempt, retried.error),
        (RunStatus::Queued, 0, None)
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    assert_eq!(
        calls.of(job_id),
        ["prepare"],
        "the retry resumed from the checkpoints"
    );
    assert!(matches!(
        engine.retry(job_id).await,
        Err(OperatorError::WrongState {
            status: RunStatus::Waiting,
            ..
        })
    ));
    assert!(matches!(
        engine.retry(Uuid::new_v4()).await,
        Err(OperatorError::NotFound(_))
    ));
}

/// Two people asked at once answer in either order: the job parks on the
/// first external step, and takes the answer of the second, ready and
/// unanswered, too (it waits for anything it awaits). A step not yet
/// ready (its needs have not ended) is still refused.
#[sqlx::test(migrator = "MIGRATOR")]
async fn two_people_asked_at_once_may_answer_in_either_order(pool: PgPool) {
    let calls = Calls::default();
    let engine = Engine::new(
        pool.clone(),
        support::echo_targets(&calls),
        support::manual_clock(),
        support::settings("w"),
    );
    engine
        .register_workflow(&json!({
            "name": "two-approvals", "input_schema": {},
            "steps": [
                {"name": "legal", "target": "echo", "method": "legal", "needs": [], "completion": "external"},
                {"name": "finance", "target": "echo", "method": "finance", "needs": [], "completion": "external"},
                {"name": "sign", "target": "echo", "method": "sign", "needs": ["legal", "finance"], "completion": "external"},
                {"name": "ship", "target": "echo", "method": "ship", "needs": ["sign"]}
            ]
        }))
        .await
        .unwrap();
    let job_id = submit(&engine, "two-approvals", json!({})).await;
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    assert_eq!(
        row(&pool, job_id).await.outstanding_step.as_deref(),
        Some("legal")
    );

    let early = engine
        .complete_step(job_id, "sign", json!({}))
        .await
        .unwrap();
    assert!(
        matches!(early, CompleteOutcome::WrongState { .. }),
        "{early:?}"
    );
    assert_eq!(
        engine
            .complete_step(job_id, "finance", json!({"ok": true}))
            .await
            .unwrap(),
        CompleteOutcome::Completed,
        "the step it is not parked on, ready and unanswered"
    );
    assert_eq!(engine.run_once().await.unwrap(), Outcome::Parked(job_id));
    assert_eq!(
        row(&pool, job_id).await.outstanding_step.as_deref(),
        Some("legal")
    );
    assert_eq!(
        engine
            .complete_step(job_id, "finance", json!({"ok": true}))
            .await
            .unwrap(),
        CompleteOutcome::AlreadyDone
    );
    for step in ["legal", "sign"] {
        assert_eq!(
            engine
                .complete_step(job_id, step, json!({"ok": true}))
                .await
                .unwrap(),
            CompleteOutcome::Completed,
            "{step}"
        );
        engine.run_once().await.unwrap();
    }
    assert_eq!(row(&pool, job_id).await.status, RunStatus::Completed);
    assert_eq!(calls.of(job_id), ["ship"]);
}
