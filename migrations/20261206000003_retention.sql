-- Retention of finished runs (docs/operations.md, "Retention"): a run that
-- finished longer ago than its workflow's retention for its final state is
-- deleted (its checkpoint rows with it), and a compact record of it kept
-- here for the idempotency horizon, so the same job id submitted again is
-- answered as a repeat (same content) or a conflict (other content) instead
-- of starting a second run. Past the horizon the record goes too.
CREATE TABLE workflow_run_removed (
    job_id         uuid        PRIMARY KEY,
    workflow_name  text        NOT NULL,
    request_digest text        NOT NULL,
    status         text        NOT NULL,
    finished_at    timestamptz NOT NULL,
    removed_at     timestamptz NOT NULL
);
CREATE INDEX workflow_run_removed_at ON workflow_run_removed (removed_at);
