-- The outbox written once. A row is inserted by the transaction that makes
-- its commit point and never updated after: the relay no longer marks rows
-- PUBLISHED, it keeps its progress per bucket as the snapshot its last
-- finished batch ended at. A row is published when its writing transaction
-- (`txid`) is visible in its bucket's snapshot; the next batch is every row
-- whose transaction is visible in a fresh snapshot and was not in that one.
-- Transactions commit out of the order of their ids, so progress cannot be
-- a txid or an id; a snapshot says exactly which transactions it saw.
--
-- A row the broker refuses for itself gets a row in
-- workflow_run_outbox_failed instead of a FAILED status; an operator's
-- replay deletes that row and gives the event a new txid, so the next batch
-- takes it again.

-- Rows of the past get txid 3 (the first normal id), inside every bucket's
-- starting snapshot: they count as done. PENDING rows get this migration's
-- own transaction id, outside it: the first batches publish them.
ALTER TABLE workflow_run_outbox ADD COLUMN txid xid8 NOT NULL DEFAULT '3';
UPDATE workflow_run_outbox SET txid = pg_current_xact_id() WHERE status = 'PENDING';
ALTER TABLE workflow_run_outbox ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

-- The status indexes go first: the FAILED rows' index has the name the
-- table of failures takes.
DROP INDEX workflow_run_outbox_pending;
DROP INDEX workflow_run_outbox_published;
DROP INDEX workflow_run_outbox_failed;

CREATE TABLE workflow_run_outbox_failed (
    job_id     UUID        NOT NULL,
    sequence   BIGINT      NOT NULL,
    bucket     SMALLINT    NOT NULL,
    error      TEXT        NOT NULL,
    failed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, sequence)
);
INSERT INTO workflow_run_outbox_failed (job_id, sequence, bucket, error)
    SELECT job_id, sequence, bucket, coalesce(last_error, 'landed FAILED before the outbox was written once')
    FROM workflow_run_outbox WHERE status = 'FAILED';

-- Everything below 4 visible: the past rows above, nothing else. And when
-- the progress last moved (an operator's "is this bucket stuck?").
ALTER TABLE relay_bucket
    ADD COLUMN published pg_snapshot NOT NULL DEFAULT '4:4:',
    ADD COLUMN published_at TIMESTAMPTZ;

ALTER TABLE workflow_run_outbox
    DROP COLUMN status,
    DROP COLUMN attempts,
    DROP COLUMN next_attempt_at,
    DROP COLUMN last_error,
    DROP COLUMN published_at;

-- A bucket's rows by writing transaction: a batch's rows are those at or
-- past its snapshot's xmin, retention's are those before it. `id` orders a
-- batch (within a job ids grow with the sequence) and names a row in it.
CREATE INDEX workflow_run_outbox_by_txid ON workflow_run_outbox (bucket, txid, id);

-- No mark rewrites a row any more: pages are filled.
ALTER TABLE workflow_run_outbox RESET (fillfactor);

-- Each row's publication state, for operators and tests: computed, not
-- stored. FAILED rows are past their bucket's snapshot too.
CREATE VIEW workflow_run_outbox_state AS
    SELECT o.id, o.event_id, o.job_id, o.sequence, o.event_type, o.bucket, o.created_at, o.txid,
           CASE WHEN f.job_id IS NOT NULL THEN 'FAILED'
                WHEN pg_visible_in_snapshot(o.txid, b.published) THEN 'PUBLISHED'
                ELSE 'PENDING' END AS status,
           f.error AS last_error
    FROM workflow_run_outbox o
    JOIN relay_bucket b ON b.bucket = o.bucket
    LEFT JOIN workflow_run_outbox_failed f ON f.job_id = o.job_id AND f.sequence = o.sequence;
