-- Heterogeneous fleets: a worker that lacks a target a job needs releases
-- the job for a worker that has it. This records since when no worker able
-- to run the job has claimed it; past a documented wait the job fails.
ALTER TABLE workflow_run ADD COLUMN unplaced_since TIMESTAMPTZ;
