//! Sample messages shared by the contract tests.
#![allow(dead_code)]

use chrono::{DateTime, TimeZone, Utc};
use flotilla_contracts::{EventHeader, WorkflowRunEvent, WorkflowRunRequest};
use serde_json::json;
use uuid::Uuid;

pub(crate) const JOB_ID: Uuid = Uuid::from_u128(0x0192_7c1e_4b2a_7d3e_9f10_2233_4455_6677);
pub(crate) const EVENT_ID: Uuid = Uuid::from_u128(0x0192_7c1e_4b2a_7d3e_9f10_8899_aabb_ccdd);

pub(crate) fn at() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 12, 30, 45).unwrap()
        + chrono::TimeDelta::microseconds(123_456)
}

pub(crate) fn header(sequence: i64) -> EventHeader {
    EventHeader {
        event_id: EVENT_ID,
        job_id: JOB_ID,
        sequence,
        workflow_name: "kyc-check".into(),
        attempt: 2,
        occurred_at: at(),
    }
}

pub(crate) fn request() -> WorkflowRunRequest {
    WorkflowRunRequest::new(
        JOB_ID,
        "kyc-check",
        json!({"customer": {"id": 42, "name": "Ada"}}),
    )
    .unwrap()
}

pub(crate) fn completed() -> WorkflowRunEvent {
    WorkflowRunEvent::completed(header(5), "approved: score 0.93", json!({"score": 0.93})).unwrap()
}

pub(crate) fn failed() -> WorkflowRunEvent {
    WorkflowRunEvent::failed(
        header(3),
        "step screen: 422 sanctions hit",
        Some("rejected".into()),
    )
    .unwrap()
}
