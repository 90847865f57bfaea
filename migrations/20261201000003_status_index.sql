-- The job list's status index holds only the statuses a job rests in.
-- RUNNING and COMPLETED are left out: every claim writes a RUNNING row and
-- every completion a COMPLETED one, and neither is a HOT update (status is
-- named by the claim's and the sweeper's partial indexes), so each of those
-- updates added one more entry to the old index. RUNNING rows are listed
-- through `workflow_run_leased` (there are as many as the fleet runs at
-- once); COMPLETED rows, most of the table, through `workflow_run_newest`.
--
-- CREATE INDEX stops writes to the table while it builds. On a large table,
-- run the CREATE below by hand first with CONCURRENTLY added; this
-- migration then finds the index and only drops the old one.
CREATE INDEX IF NOT EXISTS workflow_run_by_resting_status
    ON workflow_run (status, created_at DESC, job_id DESC)
    WHERE status IN ('QUEUED', 'WAITING', 'FAILED', 'DEAD', 'CANCELLED');
DROP INDEX IF EXISTS workflow_run_by_status;
