//! What starting a step came to (`Began`), and what a parked step waits
//! for (`Wait`): each step kind's executor answers with one, and the
//! segment's loop (`mod.rs`) applies it.

use chrono::{DateTime, Utc};
use flotilla_store::runs::Checkpoint;
use flotilla_store::runs::step_requests::OutgoingRequest;
use flotilla_targets::StepFailure;
use flotilla_workflow::expr::Scope;

use super::Node;
use super::child::NewChild;

/// What starting a step came to: the segment's loop applies it.
pub(super) enum Began {
    /// Answered at once, or skipped by its `when`: the checkpoint waits
    /// for its write.
    Answer(Checkpoint),
    /// The step failed: nothing new starts.
    Failed(StepFailure),
    /// The step waits for something outside the segment: the job parks
    /// on it once nothing else can run.
    Waits(Wait),
    /// A child to start, written with its step's "child started"
    /// checkpoint.
    StartChild(NewChild, Checkpoint),
    /// Children of a `start` step with `for_each` to start, one per item,
    /// each written with its item's "child started" checkpoint; and the
    /// keys of its children already running (`Wait::Child`'s).
    StartChildren(Vec<(NewChild, Checkpoint)>, Vec<String>),
    /// A timer that has not woken.
    Sleeps { at: DateTime<Utc>, new: bool },
    /// A call to make (the first page's, for a paged step).
    Call(Node, Scope),
    /// A `for_each` step under way: its items are handed out as calls.
    Items,
    /// The lease was lost or a cancel asked while the step waited for a
    /// slot of its target.
    Interrupted,
}

/// What a parked step waits for.
pub(super) enum Wait {
    /// A signal of this name.
    Signal(String),
    /// Its children to end, by the keys their outcomes reach the row
    /// under (the step's name, or `<step>[<index>]` per item): a child
    /// that ends before the park commits wakes it at once.
    Child(Vec<String>),
    /// The reply to its Kafka request, sent before, until this deadline.
    Reply(DateTime<Utc>),
    /// The reply to this Kafka request, sent with the park.
    Send(Box<OutgoingRequest>),
    /// Someone's answer (`completion: external`).
    Answer,
}
