-- A workflow's `concurrency`: the key a request's input gave ("<workflow>/"
-- then the key), the limit of jobs of the key that may hold a slot at once,
-- and whether this job holds one (taken when its first segment begins, kept
-- until it ends). The index finds a key's holders and waiters.
ALTER TABLE workflow_run ADD COLUMN concurrency_key text;
ALTER TABLE workflow_run ADD COLUMN concurrency_limit integer;
ALTER TABLE workflow_run ADD COLUMN holds_slot boolean NOT NULL DEFAULT false;
CREATE INDEX workflow_run_concurrency_key ON workflow_run (concurrency_key, created_at, job_id)
    WHERE concurrency_key IS NOT NULL AND status IN ('QUEUED', 'RUNNING', 'WAITING');
