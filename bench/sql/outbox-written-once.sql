-- The outbox's per-row bookkeeping against an outbox written once: WAL
-- bytes per event of the insert, the relay's mark and retention's delete
-- (bench/README.md, "The outbox written once"). Run on a database that
-- holds every migration and nothing else, for example:
--   createdb outbox_lab && DATABASE_URL=postgres://…/outbox_lab flotilla-worker migrate
--   psql postgres://…/outbox_lab -f bench/sql/outbox-written-once.sql
-- It leaves its tables behind: drop the database afterwards.
\set ON_ERROR_STOP 1
-- A: the outbox as it is. B: written once, a transaction id per row and an index by (bucket, txid).
CREATE TABLE lab_b (LIKE workflow_run_outbox INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING IDENTITY);
ALTER TABLE lab_b DROP COLUMN status, DROP COLUMN attempts, DROP COLUMN last_error, DROP COLUMN next_attempt_at, DROP COLUMN published_at;
ALTER TABLE lab_b ADD COLUMN txid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE lab_b ADD UNIQUE (job_id, sequence);
CREATE INDEX ON lab_b (bucket, txid);
CREATE TEMP TABLE jobs AS SELECT gen_random_uuid() AS job_id FROM generate_series(1, 10000);
CREATE TEMP TABLE wal (phase text, bytes numeric);
CREATE OR REPLACE FUNCTION lab_insert(t regclass) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('INSERT INTO %s (event_id, job_id, sequence, event_type, body, created_at)
    SELECT gen_random_uuid(), j.job_id, s, ''STEP_CHECKPOINT'', ''{"workflow_name":"bench","attempt":1,"occurred_at":"2026-12-07T21:00:00.123456Z","step_name":"step1"}''::jsonb, now()
    FROM jobs j CROSS JOIN generate_series(1,3) s', t);
END $$;
SELECT pg_current_wal_insert_lsn() AS l0 \gset
SELECT lab_insert('workflow_run_outbox');
SELECT pg_current_wal_insert_lsn() AS l1 \gset
INSERT INTO wal VALUES ('A insert', pg_wal_lsn_diff(:'l1', :'l0') / 30000.0);
-- the relay's marks, 500 rows a statement, by key
DO $$ DECLARE k int; BEGIN
  FOR k IN 0..59 LOOP
    UPDATE workflow_run_outbox o SET status = 'PUBLISHED', published_at = now()
    FROM (SELECT job_id, sequence FROM workflow_run_outbox WHERE status = 'PENDING' ORDER BY id LIMIT 500) a
    WHERE o.job_id = a.job_id AND o.sequence = a.sequence;
  END LOOP; END $$;
SELECT pg_current_wal_insert_lsn() AS l2 \gset
INSERT INTO wal VALUES ('A mark', pg_wal_lsn_diff(:'l2', :'l1') / 30000.0);
DELETE FROM workflow_run_outbox;
SELECT pg_current_wal_insert_lsn() AS l3 \gset
INSERT INTO wal VALUES ('A delete', pg_wal_lsn_diff(:'l3', :'l2') / 30000.0);
CHECKPOINT;
SELECT pg_current_wal_insert_lsn() AS m0 \gset
SELECT lab_insert('lab_b');
SELECT pg_current_wal_insert_lsn() AS m1 \gset
INSERT INTO wal VALUES ('B insert', pg_wal_lsn_diff(:'m1', :'m0') / 30000.0);
-- progress: one row per bucket per batch (60 batches)
DO $$ DECLARE k int; BEGIN
  FOR k IN 0..59 LOOP
    UPDATE relay_bucket SET lease_until = now() WHERE bucket = k % 64;
  END LOOP; END $$;
SELECT pg_current_wal_insert_lsn() AS m2 \gset
INSERT INTO wal VALUES ('B progress', pg_wal_lsn_diff(:'m2', :'m1') / 30000.0);
DELETE FROM lab_b;
SELECT pg_current_wal_insert_lsn() AS m3 \gset
INSERT INTO wal VALUES ('B delete', pg_wal_lsn_diff(:'m3', :'m2') / 30000.0);
SELECT phase, round(bytes) AS wal_bytes_per_event FROM wal;
