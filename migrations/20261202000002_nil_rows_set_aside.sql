-- Rows with the nil job id, which a release before 20261130000001 could
-- write, fail every UPDATE under that migration's NOT VALID check: one such
-- row QUEUED made every claim statement fail, one RUNNING stopped the
-- sweeper. They are moved here, out of every statement's way, with their
-- outbox rows (for an operator to read; nothing reads these tables), and
-- the checks are validated, so no row of either table can break them again.
CREATE TABLE workflow_run_set_aside (LIKE workflow_run);
ALTER TABLE workflow_run_set_aside
    ADD COLUMN set_aside_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN set_aside_reason text NOT NULL;
CREATE TABLE workflow_run_outbox_set_aside (LIKE workflow_run_outbox);
ALTER TABLE workflow_run_outbox_set_aside
    ADD COLUMN set_aside_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN set_aside_reason text NOT NULL;

INSERT INTO workflow_run_set_aside
    SELECT r.*, now(), 'the nil job id, which no release since 20261130000001 accepts'
    FROM workflow_run r WHERE r.job_id = '00000000-0000-0000-0000-000000000000';
INSERT INTO workflow_run_outbox_set_aside
    SELECT o.*, now(), 'the nil job id, which no release since 20261130000001 accepts'
    FROM workflow_run_outbox o WHERE o.job_id = '00000000-0000-0000-0000-000000000000';
DELETE FROM workflow_run_outbox WHERE job_id = '00000000-0000-0000-0000-000000000000';
DELETE FROM workflow_run WHERE job_id = '00000000-0000-0000-0000-000000000000';

ALTER TABLE workflow_run VALIDATE CONSTRAINT workflow_run_job_id_not_nil;
ALTER TABLE workflow_run_outbox VALIDATE CONSTRAINT workflow_run_outbox_job_id_not_nil;
