-- Rate limits of targets kept as one row per target instead of one per
-- call: `next_at` is the earliest instant the next call may begin (the
-- generic cell rate algorithm with no burst), so a permit is one statement
-- whatever the rate. The per-call log it replaces had one release of life
-- on main and held nothing that outlives a period.
DROP TABLE workflow_target_call;
CREATE TABLE workflow_target_rate (
    target text PRIMARY KEY,
    next_at timestamptz NOT NULL
);
