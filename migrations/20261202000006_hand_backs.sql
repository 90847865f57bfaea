-- Hand-backs in a row: a worker whose store failed mid-segment gives the job
-- back (attempt unspent, no lapse counted). Each one in a row, with no
-- progress between them, backs the job off twice as long, and the tenth
-- sends it DEAD: a job whose own data keeps failing the store as if it were
-- an outage must not run its steps again forever.
ALTER TABLE workflow_run ADD COLUMN hand_backs integer NOT NULL DEFAULT 0 CHECK (hand_backs >= 0);
