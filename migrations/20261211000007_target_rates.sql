-- Rate limits of targets kept as one row per target instead of one per
-- call: `last_at` is when the latest permitted call began, and the next may
-- begin one interval (period / calls, the caller's) after it: the generic
-- cell rate algorithm with no burst, a permit one statement whatever the
-- rate, a changed limit in force at once. The per-call log it replaces had
-- no release and held nothing that outlives its period.
DROP TABLE workflow_target_call;
CREATE TABLE workflow_target_rate (
    target text PRIMARY KEY,
    last_at timestamptz NOT NULL
);
