-- A parent parked on any step wakes when one of its children finishes
-- (before: only when parked on that child's step, so a parent waiting for
-- a person learned of its child only once the person answered). The
-- parent's next run takes the child's outcome, runs what needed it, and
-- parks again on what it still waits for. A completed child is progress:
-- it gives a waiting parent fresh attempts, whichever step it answers (a
-- wake that spent one would let many children exhaust them).
CREATE OR REPLACE FUNCTION flotilla_child_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    woken boolean;
BEGIN
    UPDATE workflow_run p SET
        children = coalesce(p.children, '{}'::jsonb) || jsonb_build_object(NEW.parent_step,
            jsonb_build_object('job_id', NEW.job_id, 'status', NEW.status, 'result', NEW.result,
                'error', NEW.error, 'verdict', NEW.verdict)),
        attempt = CASE WHEN p.status = 'WAITING' AND NEW.status = 'COMPLETED'
            THEN 0 ELSE p.attempt END,
        run_after = CASE WHEN p.status = 'WAITING'
            THEN least(p.run_after, NEW.updated_at) ELSE p.run_after END,
        outstanding_step = CASE WHEN p.status = 'WAITING' THEN NULL ELSE p.outstanding_step END,
        status = CASE WHEN p.status = 'WAITING' THEN 'QUEUED' ELSE p.status END
    WHERE p.job_id = NEW.parent_job_id AND p.status IN ('QUEUED', 'RUNNING', 'WAITING')
    RETURNING p.status = 'QUEUED' INTO woken;
    IF woken THEN
        PERFORM pg_notify('flotilla_runs', '');
    END IF;
    RETURN NULL;
END
$$;
