-- Calls begun to rate-limited targets within their last period: one row a
-- call, taken under a lock on the target, deleted once past the period.
CREATE TABLE workflow_target_call (
    target text NOT NULL,
    began_at timestamptz NOT NULL
);
CREATE INDEX workflow_target_call_target ON workflow_target_call (target, began_at);
