-- The two one-way switches (definitions by reference, checkpoint rows)
-- write rows that workers of releases before them cannot read. So:
-- * each worker announces the newest layout it reads (`reader_level`: 0 for
--   releases before this migration, which do not write the column);
-- * each run states the newest layout it needs (`reader_level`), and a
--   worker claims only runs it can read;
-- * a switch is turned on once, for the whole database, when no worker
--   that cannot read it is alive (`fleet_feature`), and stays on.
ALTER TABLE worker_member ADD COLUMN reader_level integer NOT NULL DEFAULT 0;
ALTER TABLE workflow_run ADD COLUMN reader_level smallint NOT NULL DEFAULT 0;

CREATE TABLE fleet_feature (
    name          TEXT        PRIMARY KEY CHECK (name IN ('checkpoint_rows', 'definition_by_reference')),
    reader_level  INTEGER     NOT NULL CHECK (reader_level >= 1),
    enabled_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    enabled_by    TEXT        NOT NULL
);

-- Runs already written with either switch need a reader of level 1, and
-- the switches they were written with are on.
UPDATE workflow_run SET reader_level = 1
WHERE has_checkpoint_rows OR definition IS NULL;
INSERT INTO fleet_feature (name, reader_level, enabled_by)
SELECT 'checkpoint_rows', 1, 'migration 20261202000004'
WHERE EXISTS (SELECT 1 FROM workflow_run WHERE has_checkpoint_rows);
INSERT INTO fleet_feature (name, reader_level, enabled_by)
SELECT 'definition_by_reference', 1, 'migration 20261202000004'
WHERE EXISTS (SELECT 1 FROM workflow_run WHERE definition IS NULL);
