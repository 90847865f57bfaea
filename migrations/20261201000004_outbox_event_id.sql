-- The outbox keeps no index on event_id. No statement looks an event up by
-- its id, and the id is a random UUID the writer draws (122 random bits),
-- so the unique index guarded against nothing that can happen while it
-- cost one insert into a random leaf of a large index for every outbox row
-- written and again for every row marked (a mark changes the status, which
-- partial indexes name, so it is never a HOT update and every index of the
-- table gets an entry for the new row version).
ALTER TABLE workflow_run_outbox DROP CONSTRAINT IF EXISTS workflow_run_outbox_event_id_key;
