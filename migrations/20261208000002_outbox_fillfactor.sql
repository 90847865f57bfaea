-- Room on each outbox page for the relay's mark of the rows written there.
-- A mark is never HOT (it changes `status`, which the partial indexes name),
-- but when the row's new version fits on its own page Postgres logs only the
-- bytes that changed and no lock of the old version; on a full page it logs
-- the whole new row and a lock record besides. Half of each page is left
-- for the marks: a 1-step job's three marks wrote 1,345 bytes of WAL on full
-- pages and 923 with this (bench/README.md). New pages only; existing pages
-- keep what they have until rewritten.
ALTER TABLE workflow_run_outbox SET (fillfactor = 50);
