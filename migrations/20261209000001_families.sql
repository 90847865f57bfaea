-- A family is a job nobody started (its root) and every job started under
-- it, at any depth. Depth alone bounded nesting, not breadth: three `start`
-- steps of itself at depth 8 made thousands of jobs from one submission.
-- Each child records its root; the family's job count, root included, is
-- kept in a row of its own, raised in the transaction that starts a child
-- and refused past the fleet's bound (FLOTILLA_MAX_FAMILY_JOBS). That row
-- is always the last lock such a transaction takes, after the parent's.
ALTER TABLE workflow_run ADD COLUMN root_job_id uuid;

CREATE TABLE workflow_family (
    root_job_id uuid PRIMARY KEY REFERENCES workflow_run (job_id) ON DELETE CASCADE,
    jobs integer NOT NULL
);
