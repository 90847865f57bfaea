-- Schedules (docs/architecture.md, "Schedules"): each starts its workflow
-- with its input at every tick of a cron expression in a time zone, or of an
-- interval. A tick's job id is derived from the schedule's id and the tick's
-- instant, so whichever worker starts it, and however often, it is one job.
CREATE TABLE workflow_schedule (
    name text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    -- Fresh at every create or replace: a tick's job id is derived from it.
    schedule_id uuid NOT NULL,
    workflow_name text NOT NULL,
    input jsonb NOT NULL,
    cron text,
    time_zone text NOT NULL DEFAULT 'UTC',
    interval_ms bigint CHECK (interval_ms > 0),
    -- What a tick that came while no worker could start it becomes: `skip`
    -- (nothing, unless it is at most a minute late) or `run_once` (one job
    -- for the latest such tick).
    missed text NOT NULL DEFAULT 'skip' CHECK (missed IN ('skip', 'run_once')),
    paused boolean NOT NULL DEFAULT false,
    next_run_at timestamptz NOT NULL,
    last_tick_at timestamptz,
    last_job_id uuid,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CHECK ((cron IS NULL) <> (interval_ms IS NULL))
);
-- The ticker's question: which running schedules are due.
CREATE INDEX workflow_schedule_due ON workflow_schedule (next_run_at) WHERE NOT paused;
