-- A workflow's `execution_timeout_ms`: the instant the job stops, fixed
-- when it is accepted. Past it, a worker fails the job as timed out at
-- its next claim (running its compensation); the due-waits sweep brings a
-- WAITING job, or one QUEUED for later, back at once to meet it. NULL: no
-- bound. Workers of earlier releases leave it alone.
ALTER TABLE workflow_run ADD COLUMN expires_at timestamptz;
CREATE INDEX workflow_run_expires_at ON workflow_run (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('QUEUED', 'WAITING');
