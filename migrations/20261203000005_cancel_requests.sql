-- A cancellation asked of a RUNNING job: the reason (who asked included).
-- The worker holding the job learns it at its next heartbeat, stops the
-- calls under way and ends the job CANCELLED; a job whose worker is gone
-- is cancelled when it is next swept or claimed. NULL: none asked.
ALTER TABLE workflow_run ADD COLUMN cancel_requested text;
