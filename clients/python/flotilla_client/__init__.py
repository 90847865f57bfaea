"""Talk to a Flotilla fleet from Python: submit workflow runs
(``KafkaSubmitter``, ``ApiSubmitter``), wait for their results
(``submit_and_wait``) and consume each job's events once
and in order (``EventStream``). See docs/clients.md in the repository."""

from .events import Delivery, EventStream, Gap, Misconfigured, StreamError, Undecodable
from .events import Unavailable as StreamUnavailable
from .order import JobSequences, Next, Repeat, Skipped, classify
from .jobs import AsyncJobs, JobConflict, JobNotFound, Jobs
from .waiting import JobCancelled, JobDead, JobFailed, JobNotCompleted, WaitTimedOut
from .submitter import ApiSubmitter, KafkaSubmitter, Receipt, Rejected, SettingsError, SubmitError, Unavailable
from .wire import EventType, NotAnEvent, WorkflowRunEvent, event_from_json, event_to_avro_fields, event_to_json

__all__ = [
    "ApiSubmitter", "AsyncJobs", "Delivery", "JobConflict", "JobNotFound", "Jobs", "JobCancelled", "JobDead", "JobFailed", "JobNotCompleted", "WaitTimedOut", "EventStream", "EventType", "Gap", "JobSequences", "KafkaSubmitter",
    "Misconfigured", "Next", "NotAnEvent", "Receipt", "Rejected", "Repeat", "SettingsError", "Skipped", "StreamError",
    "StreamUnavailable", "SubmitError", "Unavailable", "Undecodable", "WorkflowRunEvent", "classify",
    "event_from_json", "event_to_avro_fields", "event_to_json",
]
