//! The fixtures file: the answers a rehearsal gives in place of the world,
//! and the outcome it expects. YAML or JSON; unknown fields are refused, so
//! a misspelt key is an error rather than an answer silently not given.
//!
//! ```yaml
//! workflow: payment          # which definition runs (the first given if omitted)
//! input: {amount: 120}
//! answers:                   # per step, in call order; the last answers every later call
//!   authorize:
//!     - answer: {authorized: true}
//!   capture:
//!     - status: 503          # classified as an HTTP target classifies it
//!       retry_after: "30"    # its Retry-After header, if any
//!     - answer: {captured: true}
//! signals: {}                # signal name → payload, sent once the job waits
//! completions: {}            # external step → its answer, given once the job waits
//! children: {}               # start step → {result: …} or {verdict: …}
//! expect:
//!   state: COMPLETED
//!   result: {captured: true}
//!   calls: {capture: 2}
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value as Json;

/// A fixtures file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixtures {
    /// The workflow to run, by name: one of the definitions given.
    #[serde(default)]
    pub workflow: Option<String>,
    /// The job's input.
    #[serde(default = "empty_object")]
    pub input: Json,
    /// Step name → its answers in call order (each item of a `for_each`
    /// and each page is a call); the last answers every call after it.
    #[serde(default)]
    pub answers: BTreeMap<String, Vec<Answer>>,
    /// Signal name → payload, sent once the job waits.
    #[serde(default)]
    pub signals: BTreeMap<String, Json>,
    /// `completion: external` step → the answer someone gives it.
    #[serde(default)]
    pub completions: BTreeMap<String, Json>,
    /// `start` step → how its child ends, when the child's own definition
    /// is not given.
    #[serde(default)]
    pub children: BTreeMap<String, ChildEnd>,
    /// The outcome the run must reach; without it any outcome passes.
    #[serde(default)]
    pub expect: Option<Expect>,
}

fn empty_object() -> Json {
    Json::Object(serde_json::Map::new())
}

/// One answer of a target, as recorded.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// A 200 with this JSON body (`null` included).
    #[serde(default, deserialize_with = "present")]
    pub answer: Option<Json>,
    /// An HTTP status, with `body`: retried, a verdict or a defect exactly
    /// as the HTTP target classifies it (503 retries, 422 with
    /// `violations` is a verdict, 500 fails the job).
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default, deserialize_with = "present")]
    pub body: Option<Json>,
    /// The `Retry-After` header sent with `status` (`"30"`, or an HTTP-date).
    #[serde(default)]
    pub retry_after: Option<String>,
    /// The target could not be reached (a transient failure), with why.
    #[serde(default)]
    pub unreachable: Option<String>,
}

/// Keeps an explicit `null` apart from an absent field.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Json>, D::Error> {
    Json::deserialize(deserializer).map(Some)
}

/// How a stood-in child ends.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildEnd {
    /// It completes with this result (an object).
    #[serde(default)]
    pub result: Option<serde_json::Map<String, Json>>,
    /// It fails with this verdict.
    #[serde(default)]
    pub verdict: Option<String>,
}

/// The outcome a rehearsal must reach.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// COMPLETED, FAILED, DEAD or CANCELLED.
    pub state: String,
    /// The job's result, whole.
    #[serde(default, deserialize_with = "present")]
    pub result: Option<Json>,
    /// Text the job's verdict or error contains.
    #[serde(default)]
    pub verdict: Option<String>,
    /// Step name → how many calls its target got.
    #[serde(default)]
    pub calls: BTreeMap<String, usize>,
    /// Steps that must have been skipped by their `when`.
    #[serde(default)]
    pub skipped: Vec<String>,
}

impl Fixtures {
    /// Reads a fixtures file's text (YAML or JSON) and checks it.
    ///
    /// # Errors
    /// Not YAML or JSON, an unknown field, or an answer that says nothing
    /// or two things.
    pub fn parse(text: &str) -> Result<Self, String> {
        let document = flotilla_workflow::read_document(text)?;
        let fixtures: Self = serde_json::from_value(document).map_err(|e| e.to_string())?;
        fixtures.check()?;
        Ok(fixtures)
    }

    fn check(&self) -> Result<(), String> {
        for (step, answers) in &self.answers {
            if answers.is_empty() {
                return Err(format!("answers.{step}: give at least one answer"));
            }
            for (i, answer) in answers.iter().enumerate() {
                let given = [
                    answer.answer.is_some(),
                    answer.status.is_some(),
                    answer.unreachable.is_some(),
                ];
                if given.iter().filter(|g| **g).count() != 1 {
                    return Err(format!(
                        "answers.{step}[{i}]: give exactly one of answer, status or unreachable"
                    ));
                }
                if (answer.body.is_some() || answer.retry_after.is_some())
                    && answer.status.is_none()
                {
                    return Err(format!(
                        "answers.{step}[{i}]: body and retry_after go with status (a 200's body is answer)"
                    ));
                }
                if let Some(status) = answer.status
                    && !(100..=599).contains(&status)
                {
                    return Err(format!(
                        "answers.{step}[{i}]: status {status} is not an HTTP status"
                    ));
                }
            }
        }
        for (step, end) in &self.children {
            if end.result.is_some() == end.verdict.is_some() {
                return Err(format!(
                    "children.{step}: give exactly one of result or verdict"
                ));
            }
        }
        if let Some(expect) = &self.expect
            && !["COMPLETED", "FAILED", "DEAD", "CANCELLED"].contains(&expect.state.as_str())
        {
            return Err(format!(
                "expect.state: {:?} is not one of COMPLETED, FAILED, DEAD, CANCELLED",
                expect.state
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_answer_is_an_answer_and_an_absent_one_is_not() {
        let fixtures = Fixtures::parse("answers: {a: [{answer: null}]}").unwrap();
        assert_eq!(fixtures.answers["a"][0].answer, Some(Json::Null));
        let refused = Fixtures::parse("answers: {a: [{}]}").unwrap_err();
        assert!(refused.contains("exactly one of"), "{refused}");
    }

    #[test]
    fn misspelt_and_contradictory_fixtures_are_refused_with_where() {
        let cases = [
            ("answer: {a: [{answer: 1}]}", "unknown field `answer`"),
            ("answers: {a: [{answer: 1, status: 503}]}", "answers.a[0]"),
            ("answers: {a: [{body: 1}]}", "answers.a[0]"),
            ("answers: {a: [{status: 900}]}", "not an HTTP status"),
            ("answers: {a: []}", "at least one"),
            ("children: {c: {}}", "children.c"),
            ("expect: {state: DONE}", "expect.state"),
            (
                "expect: {state: COMPLETED, calls: {a: 1}, skip: [b]}",
                "unknown field `skip`",
            ),
        ];
        for (text, said) in cases {
            let error = Fixtures::parse(text).unwrap_err();
            assert!(error.contains(said), "{text}: {error}");
        }
    }
}
