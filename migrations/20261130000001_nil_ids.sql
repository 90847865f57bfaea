-- No job is ever identified by the nil UUID: the contract refuses it on the
-- wire and the API refuses it with a 400; the schema refuses it too, so no
-- path can write a job (or an event) that can never be published.
-- NOT VALID: rows an older version may have written do not block the
-- migration; every new or updated row is checked.
ALTER TABLE workflow_run
    ADD CONSTRAINT workflow_run_job_id_not_nil
    CHECK (job_id <> '00000000-0000-0000-0000-000000000000') NOT VALID;
ALTER TABLE workflow_run_outbox
    ADD CONSTRAINT workflow_run_outbox_job_id_not_nil
    CHECK (job_id <> '00000000-0000-0000-0000-000000000000') NOT VALID;
