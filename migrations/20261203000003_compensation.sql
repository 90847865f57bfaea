-- A job's compensation (on_failure steps): the failure it is headed to end
-- with and the compensation steps answered so far, {failure, done}. Set
-- when a graph job about to end FAILED or DEAD starts compensating, so a
-- worker that resumes it goes on compensating instead of running the
-- failed step again; an operator's retry clears it. NULL: none.
ALTER TABLE workflow_run ADD COLUMN compensation jsonb;
