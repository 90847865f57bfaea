-- A checkpoint may be a row of its own instead of an element appended to
-- the run row's `checkpoints` array. Appending rewrites the whole array
-- (and the WAL carries it again) at every step, so a job's write cost grew
-- with every earlier response; a row of its own is written once.
--
-- A run's checkpoints read as its array followed by its rows, in the order
-- of their events. `has_checkpoint_rows` marks a run whose later
-- checkpoints are rows: once set, every writer of this release adds rows
-- for that run, whatever its setting, so the two parts never interleave.
--
-- Workers of this release read both; whether they start runs on rows is a
-- setting (FLOTILLA_CHECKPOINT_ROWS), off until no older worker, which
-- reads only the array, can claim the run.
ALTER TABLE workflow_run ADD COLUMN has_checkpoint_rows boolean NOT NULL DEFAULT false;

CREATE TABLE workflow_run_checkpoint (
    job_id uuid NOT NULL REFERENCES workflow_run (job_id) ON DELETE CASCADE,
    -- The sequence of the run's STEP_CHECKPOINT event for this step:
    -- unique per run and increasing with every write.
    event_sequence bigint NOT NULL,
    -- One element of the run's checkpoint list: {name, skipped, response}.
    entry jsonb NOT NULL,
    PRIMARY KEY (job_id, event_sequence)
);
