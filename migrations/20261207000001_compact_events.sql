-- Outbox rows keep their event without what their columns already hold.
-- `body` is the event's JSON less `event_id`, `job_id`, `sequence` and
-- `type` (the row's columns) and less the absent step name, verdict and
-- error; readers put those back. It saves about 200 bytes of WAL and heap
-- per event (issue 28). Rows of earlier writers keep the whole event in
-- `payload`; a row has exactly one of the two.
--
-- A relay of an earlier release reads `payload` as never NULL: on a row
-- with only a `body` its read fails as a whole and it retries, publishing
-- nothing more until it is replaced, and loses nothing (docs/operations.md,
-- "Outbox rows without their ids").
ALTER TABLE workflow_run_outbox ADD COLUMN body JSONB;
ALTER TABLE workflow_run_outbox ALTER COLUMN payload DROP NOT NULL;
-- NOT VALID: every existing row has a payload and no body, and checking
-- them would hold the table locked for a scan of the whole history.
ALTER TABLE workflow_run_outbox
    ADD CONSTRAINT workflow_run_outbox_one_form CHECK (num_nonnulls(payload, body) = 1) NOT VALID;
