-- A lapsed lease is not a failure of the work: it gives its attempt back and
-- counts here instead. A job that loses its worker too many times in a row
-- (the one that crashes its worker every time) goes DEAD; any commit point
-- of a segment (progress) starts the count again.
ALTER TABLE workflow_run
    ADD COLUMN lease_losses INTEGER NOT NULL DEFAULT 0 CHECK (lease_losses >= 0);
