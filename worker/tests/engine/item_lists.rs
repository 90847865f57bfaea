//! A `for_each` list is the same on every segment: a map's keys are
//! listed in sorted order, and a list that changes between segments fails
//! the job instead of giving the answers kept by index to other items.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_store::RunStatus;
use flotilla_worker::engine::Outcome;
use flotilla_worker::targets::{FnTarget, RetryClass, StepFailure, TargetCall, Targets};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{engine, manual_clock, row, submit};

const MIGRATOR: &sqlx::migrate::Migrator = &flotilla_store::MIGRATOR;

/// `pay` calls `bank` once per key of the map `input.accounts`, in
/// whatever order the list gives them, one at a time.
fn paying() -> Value {
    json!({
        "name": "paying", "input_schema": {}, "parallelism": 1,
        "steps": [{"name": "pay", "target": "bank", "method": "pay",
                   "for_each": "input.accounts.map(k, k)", "rules": ["account = item"]}]
    })
}

/// One call `bank` saw: the account, the call's part of its step (the
/// idempotency key's tail) and whether it was answered.
#[derive(Debug, Clone, PartialEq)]
struct Payment {
    account: String,
    part: Option<String>,
    answered: bool,
}

/// Every call `bank` saw, on every worker.
#[derive(Debug, Clone, Default)]
struct Ledger(Arc<Mutex<Vec<Payment>>>);

impl Ledger {
    /// A worker's `bank`: answers `{"paid": <account>}` to its first
    /// `answers` calls and a retryable 503 to the rest.
    fn bank(&self, answers: usize) -> Targets {
        let ledger = self.clone();
        let mut targets = Targets::default();
        targets.register(
            "bank",
            Arc::new(FnTarget(move |call: TargetCall| {
                let account = call.request["account"].as_str().unwrap().to_owned();
                let mut seen = ledger.0.lock().unwrap();
                let answered = seen.iter().filter(|p| p.answered).count() < answers;
                seen.push(Payment {
                    account: account.clone(),
                    part: call.part.clone(),
                    answered,
                });
                async move {
                    if answered {
                        Ok(json!({"paid": account}))
                    } else {
                        Err(StepFailure::retryable(
                            RetryClass::Status,
                            "503 from the bank",
                        ))
                    }
                }
            })),
            8,
        );
        targets
    }

    fn payments(&self) -> Vec<Payment> {
        self.0.lock().unwrap().clone()
    }
}

/// `count` accounts, named so that no hash order is likely to be sorted.
fn accounts(count: usize) -> serde_json::Map<String, Value> {
    (0..count)
        .map(|i| (format!("acct-{:02}", (i * 7) % count), json!(i)))
        .collect()
}

/// A first worker answers 5 items and then meets a retryable failure;
/// a second worker, a fresh engine, resumes the step. The crate's maps
/// iterate in a new hash order on each evaluation, so without a fixed
/// order the second segment would list the keys otherwise and give the
/// five answers, kept by index, to other keys.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_for_each_over_a_map_lists_its_keys_in_sorted_order_on_every_segment(pool: PgPool) {
    let ledger = Ledger::default();
    let clock = manual_clock();
    let first = engine(&pool, ledger.bank(5), clock.clone(), "first");
    first.register_workflow(&paying()).await.unwrap();
    let input = json!({"accounts": accounts(20)});
    let job_id = submit(&first, "paying", input).await;
    assert_eq!(first.run_once().await.unwrap(), Outcome::Requeued(job_id));
    assert_eq!(ledger.payments().iter().filter(|p| p.answered).count(), 5);

    // Past the backoff, on another worker.
    clock.advance(Duration::from_secs(3600));
    let second = engine(&pool, ledger.bank(usize::MAX), clock.clone(), "second");
    let outcome = second.run_once().await.unwrap();
    let done = row(&pool, job_id).await;
    assert_eq!(outcome, Outcome::Completed(job_id), "{:?}", done.error);

    let mut sorted: Vec<String> = accounts(20).keys().cloned().collect();
    sorted.sort();
    let payments = ledger.payments();
    for (index, account) in sorted.iter().enumerate() {
        let calls: Vec<&Payment> = payments.iter().filter(|p| &p.account == account).collect();
        assert_eq!(
            calls.iter().filter(|p| p.answered).count(),
            1,
            "{account} must be paid once: {payments:?}"
        );
        for call in calls {
            assert_eq!(
                call.part.as_deref(),
                Some(format!("item-{index}").as_str()),
                "{account} is item {index} on every segment: {payments:?}"
            );
        }
    }
    let paid: Vec<Value> = sorted.iter().map(|a| json!({"paid": a})).collect();
    assert_eq!(
        done.result.map(|r| r.0),
        Some(json!(paid)),
        "output[i] answers list[i]"
    );
    // The list's digest is kept once, with the first item checkpointed.
    let digests = done.checkpoints.0.as_array().unwrap().iter();
    let with_digest: Vec<&Value> = digests.filter(|c| c.get("list").is_some()).collect();
    assert_eq!(with_digest.len(), 1, "{with_digest:?}");
    assert_eq!(with_digest[0]["item"], json!(0));
}

/// A list that differs on a later segment (as one built from something
/// that changed would; here the input, edited under the job) fails the
/// job as a defect naming the step, before anything more is called.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_for_each_list_that_changed_since_its_first_answers_fails_the_job_naming_the_step(
    pool: PgPool,
) {
    let ledger = Ledger::default();
    let clock = manual_clock();
    let first = engine(&pool, ledger.bank(3), clock.clone(), "first");
    first.register_workflow(&paying()).await.unwrap();
    let job_id = submit(&first, "paying", json!({"accounts": accounts(6)})).await;
    assert_eq!(first.run_once().await.unwrap(), Outcome::Requeued(job_id));
    let called = ledger.payments().len();

    let mut changed = accounts(6);
    changed.remove("acct-00");
    changed.insert("acct-99".into(), json!(99));
    edit_input(&pool, job_id, json!({"accounts": changed})).await;
    clock.advance(Duration::from_secs(3600));
    let second = engine(&pool, ledger.bank(usize::MAX), clock.clone(), "second");
    assert_eq!(second.run_once().await.unwrap(), Outcome::Failed(job_id));
    let failed = row(&pool, job_id).await;
    assert_eq!(failed.status, RunStatus::Failed);
    let error = failed.error.unwrap_or_default();
    assert!(
        error.starts_with("step pay: for_each gave a different list"),
        "{error}"
    );
    assert!(failed.verdict.is_none(), "a defect, not a verdict");
    assert_eq!(ledger.payments().len(), called, "nothing more was called");
}

async fn edit_input(pool: &PgPool, job_id: Uuid, input: Value) {
    sqlx::query("UPDATE workflow_run SET input = $2 WHERE job_id = $1")
        .bind(job_id)
        .bind(input)
        .execute(pool)
        .await
        .unwrap();
}
