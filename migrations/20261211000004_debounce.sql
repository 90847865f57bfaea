-- A workflow's `debounce`: the key a request's input gave ("<workflow>/"
-- then the key's JSON). A later request of the key cancels the jobs of it
-- that have not started yet; the index finds them.
ALTER TABLE workflow_run ADD COLUMN debounce_key text;
CREATE INDEX workflow_run_debounce_key ON workflow_run (debounce_key)
    WHERE debounce_key IS NOT NULL AND status = 'QUEUED';
