-- A job's definition revision: 0 as submitted, one more for each graft
-- (steps appended to the job's own copy of its definition).
ALTER TABLE workflow_run ADD COLUMN revision integer NOT NULL DEFAULT 0 CHECK (revision >= 0);
