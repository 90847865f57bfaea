//! The fixtures as targets: every target a definition names answers from
//! the recorded answers of the calling step, in call order, and every call
//! is written down with the virtual time it was made at.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use flotilla_engine::{Clock, ManualClock};
use flotilla_targets::{RetryClass, StepFailure, Target, TargetCall, Targets};
use serde_json::Value as Json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::fixtures::{Answer, ChildEnd};

/// A call a step made, and what it was answered.
#[derive(Debug, Clone)]
pub struct Call {
    pub at: DateTime<Utc>,
    pub job_id: Uuid,
    pub step: String,
    /// `item-3`, `page-2`, or none for a whole step.
    pub part: Option<String>,
    pub request: Json,
    /// The sequence of the job's last event committed when the call was
    /// made: the call comes after that event and before the next.
    pub after_event: i64,
    /// The answer, or the failure it was taken as.
    pub answered: Result<Json, StepFailure>,
}

/// What every fixture target shares: the answers, the calls so far.
#[derive(Debug)]
pub(crate) struct Recorded {
    answers: BTreeMap<String, Vec<Answer>>,
    /// How stood-in children end, by the step that starts them.
    children: BTreeMap<String, ChildEnd>,
    /// Stood-in children's job ids → the step that starts each.
    stand_ins: Mutex<HashMap<Uuid, String>>,
    clock: Arc<ManualClock>,
    /// The rehearsal's database, where a call reads how far its job got.
    pool: PgPool,
    log: Mutex<Log>,
}

#[derive(Debug, Default)]
struct Log {
    calls: Vec<Call>,
    /// Calls made per step so far.
    made: HashMap<String, usize>,
    /// Steps that were called with no answer recorded for them.
    unanswered: Vec<String>,
}

/// The name of the target a stood-in child calls for its end.
pub(crate) const CHILD_TARGET: &str = "rehearsal-child";

impl Recorded {
    pub(crate) fn new(
        answers: BTreeMap<String, Vec<Answer>>,
        children: BTreeMap<String, ChildEnd>,
        clock: Arc<ManualClock>,
        pool: PgPool,
    ) -> Arc<Self> {
        Arc::new(Self {
            answers,
            children,
            stand_ins: Mutex::default(),
            clock,
            pool,
            log: Mutex::new(Log::default()),
        })
    }

    /// Targets of these names, each answering from the fixtures, and the
    /// stood-in children's.
    pub(crate) fn targets(self: &Arc<Self>, names: impl IntoIterator<Item = String>) -> Targets {
        let mut targets = Targets::default();
        for name in names {
            let target = FixtureTarget {
                name: name.clone(),
                recorded: self.clone(),
            };
            targets.register(name, Arc::new(target), usize::MAX >> 4);
        }
        targets.register(
            CHILD_TARGET,
            Arc::new(FixtureTarget {
                name: CHILD_TARGET.to_owned(),
                recorded: self.clone(),
            }),
            usize::MAX >> 4,
        );
        targets
    }

    /// The child `job_id` is the stood-in child of `step`.
    pub(crate) fn stand_in(&self, job_id: Uuid, step: &str) {
        self.stand_ins
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(job_id, step.to_owned());
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    pub(crate) fn unanswered(&self) -> Vec<String> {
        self.lock().unanswered.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn answer(&self, target: &str, call: &TargetCall) -> Result<Json, StepFailure> {
        // The call as an HTTP target names it in its errors (a step that
        // names no verb: POST, as a target without a `verb` has it).
        let url = match &call.shape {
            Some(shape) => {
                let shown = shape.shown(flotilla_workflow::Verb::Post);
                let (verb, path) = shown.split_once(' ').unwrap_or(("POST", "/"));
                format!("{verb} {target}{path}")
            }
            None => format!("POST {target}/{}", call.method),
        };
        if target == CHILD_TARGET {
            let step = self
                .stand_ins
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&call.job_id)
                .cloned()
                .unwrap_or_default();
            return match self.children.get(&step) {
                Some(ChildEnd {
                    result: Some(result),
                    ..
                }) => Ok(Json::Object(result.clone())),
                Some(ChildEnd {
                    verdict: Some(verdict),
                    ..
                }) => Err(StepFailure::Verdict {
                    message: verdict.clone(),
                    violations: vec![verdict.clone()],
                }),
                _ => Err(StepFailure::Defect(format!(
                    "the fixtures say nothing of the child of step {step:?}"
                ))),
            };
        }
        let mut log = self.lock();
        let made = log.made.entry(call.step_name.clone()).or_default();
        let nth = *made;
        *made += 1;
        let Some(answers) = self.answers.get(&call.step_name) else {
            log.unanswered.push(call.step_name.clone());
            return Err(StepFailure::Defect(format!(
                "the fixtures hold no answer for step {}",
                call.step_name
            )));
        };
        drop(log);
        let answer = &answers[nth.min(answers.len() - 1)];
        match (&answer.answer, answer.status, &answer.unreachable) {
            (Some(body), _, _) => Ok(body.clone()),
            (None, Some(status), _) => {
                let body = answer
                    .body
                    .as_ref()
                    .map(|b| serde_json::to_vec(b).unwrap_or_default())
                    .unwrap_or_default();
                flotilla_targets::http::classify_recorded(
                    &url,
                    status,
                    &body,
                    answer.retry_after.as_deref(),
                )
            }
            (None, None, Some(why)) => Err(StepFailure::retryable(
                RetryClass::Transport,
                format!("{url}: {why}"),
            )),
            // `Fixtures::parse` refuses an answer that gives none.
            (None, None, None) => Err(StepFailure::Defect(format!(
                "answers.{}[{nth}] gives nothing",
                call.step_name
            ))),
        }
    }
}

#[derive(Debug)]
struct FixtureTarget {
    name: String,
    recorded: Arc<Recorded>,
}

#[async_trait::async_trait]
impl Target for FixtureTarget {
    async fn call(&self, call: TargetCall) -> Result<Json, StepFailure> {
        let answered = self.recorded.answer(&self.name, &call);
        if self.name != CHILD_TARGET {
            let after_event =
                sqlx::query_scalar("SELECT event_sequence FROM workflow_run WHERE job_id = $1")
                    .bind(call.job_id)
                    .fetch_optional(&self.recorded.pool)
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or(0);
            self.recorded.lock().calls.push(Call {
                at: self.recorded.clock.now(),
                after_event,
                job_id: call.job_id,
                step: call.step_name,
                part: call.part,
                request: call.request,
                answered: answered.clone(),
            });
        }
        answered
    }
}
