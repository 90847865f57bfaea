-- Child workflows (docs/architecture.md, "Child workflows"). A child row
-- names its parent and the parent's step that started it; its id is derived
-- from those two, so a retry or a crash never starts a second one.
ALTER TABLE workflow_run
    ADD COLUMN parent_job_id uuid,
    ADD COLUMN parent_step text,
    -- 0 for a job nobody started; a child is one deeper than its parent.
    ADD COLUMN depth smallint NOT NULL DEFAULT 0 CHECK (depth >= 0),
    -- Whether cancelling the parent cancels this child (the step's
    -- `cancel_children`).
    ADD COLUMN cancel_with_parent boolean NOT NULL DEFAULT true,
    -- A parent's finished children, by the step that started each:
    -- {job_id, status, result, error, verdict}. Written by the trigger below
    -- in the child's own terminal transaction; the parent's step takes it
    -- when the parent next runs.
    ADD COLUMN children jsonb;

-- A parent's children, for the cancel cascade and the API.
CREATE INDEX workflow_run_parent ON workflow_run (parent_job_id) WHERE parent_job_id IS NOT NULL;

-- When a child reaches a terminal state (or is linked to its parent while
-- already in one), its outcome is written to the parent row in the same
-- transaction, and a parent parked on that step is queued with a wake-up.
-- A trigger, so that every path to a terminal state (a worker's fenced
-- write, an operator's cancel, the sweeper, a refused submission) does it.
CREATE FUNCTION flotilla_child_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    woken boolean;
BEGIN
    UPDATE workflow_run p SET
        children = coalesce(p.children, '{}'::jsonb) || jsonb_build_object(NEW.parent_step,
            jsonb_build_object('job_id', NEW.job_id, 'status', NEW.status, 'result', NEW.result,
                'error', NEW.error, 'verdict', NEW.verdict)),
        -- A completed child gives its parent fresh attempts, as an answer
        -- to a human step does; a failed one leaves them counted.
        attempt = CASE WHEN p.status = 'WAITING' AND p.outstanding_step = NEW.parent_step
            AND NEW.status = 'COMPLETED' THEN 0 ELSE p.attempt END,
        run_after = CASE WHEN p.status = 'WAITING' AND p.outstanding_step = NEW.parent_step
            THEN least(p.run_after, NEW.updated_at) ELSE p.run_after END,
        outstanding_step = CASE WHEN p.status = 'WAITING' AND p.outstanding_step = NEW.parent_step
            THEN NULL ELSE p.outstanding_step END,
        status = CASE WHEN p.status = 'WAITING' AND p.outstanding_step = NEW.parent_step
            THEN 'QUEUED' ELSE p.status END
    WHERE p.job_id = NEW.parent_job_id AND p.status IN ('QUEUED', 'RUNNING', 'WAITING')
    RETURNING p.status = 'QUEUED' INTO woken;
    IF woken THEN
        PERFORM pg_notify('flotilla_runs', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER workflow_run_child_finished
    AFTER UPDATE OF status, parent_job_id ON workflow_run
    FOR EACH ROW
    WHEN (NEW.parent_job_id IS NOT NULL
        AND NEW.status IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')
        AND (OLD.status IS DISTINCT FROM NEW.status OR OLD.parent_job_id IS DISTINCT FROM NEW.parent_job_id))
    EXECUTE FUNCTION flotilla_child_finished();
