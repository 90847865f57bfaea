-- A caller's labels on a job (the request's `metadata`: at most 16 string
-- entries), kept with the run, echoed on its events, searched with `@>`.
-- NULL for a job without any; the index holds only the labelled ones.
ALTER TABLE workflow_run ADD COLUMN metadata jsonb;
CREATE INDEX workflow_run_metadata ON workflow_run USING gin (metadata jsonb_path_ops)
    WHERE metadata IS NOT NULL;
