//! The durable run engine against a real Postgres (a fresh database per
//! test). Each test is named after the guarantee it proves.

mod backlog;
mod backoff;
mod cancelling;
mod checkpoint_rows;
mod children;
mod claims;
mod concurrency;
mod deadlines;
mod debounce;
mod failures;
mod grafts;
mod graphs;
mod hostile;
mod item_lists;
mod kafka_steps;
mod lapses;
mod namesakes;
mod panics;
mod parking;
mod placement;
mod priorities;
mod rate_limits;
mod responses;
mod retention;
mod scheduler_property;
mod schedules;
mod signals;
mod step_retries;
mod stored_answers;
mod submission;
mod support;
mod switches;
mod versions;
mod wait_timeouts;
mod wake_ups;
