-- The outbox's rows are reached by their key, (job_id, sequence), and no
-- longer by `id`. Every mark changes `status`, which the partial indexes
-- name, so a mark is never a HOT update: each index of the table takes an
-- entry for the row written and another for every mark. The primary key on
-- `id` served only the relay's marks and failures and retention's deletes,
-- which the key serves as well; `id` stays for the order in which the relay
-- reads a bucket (the index of PENDING rows) and the operator's list of
-- FAILED rows. The unique key becomes the replica identity, so logical
-- replication of the table keeps working without a primary key.
--
-- A relay of an earlier release still marks by `id`: after this migration
-- each of its marks reads the whole table. Replace relays with or before
-- workers (docs/operations.md, "Outbox rows reached by their key").
ALTER TABLE workflow_run_outbox
    REPLICA IDENTITY USING INDEX workflow_run_outbox_job_id_sequence_key;
ALTER TABLE workflow_run_outbox DROP CONSTRAINT workflow_run_outbox_pkey;
