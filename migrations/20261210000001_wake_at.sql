-- While WAITING: the instant of the earliest timer (`sleep`, `until`) the
-- job has reached on another branch and not yet passed. A job parked on a
-- person's step, a signal or a child still has work behind that timer: a
-- worker's sweep puts it back in the queue at that instant, as it does at
-- `reply_deadline`, and the job parks again once the timer's branch has
-- run. Meaningless in any other state; workers of earlier releases leave
-- it NULL (their parks wait for the answer only, as before).
ALTER TABLE workflow_run ADD COLUMN wake_at timestamptz;
CREATE INDEX workflow_run_wake_at ON workflow_run (wake_at)
    WHERE status = 'WAITING' AND wake_at IS NOT NULL;
