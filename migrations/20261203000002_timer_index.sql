-- The jobs asleep on a timer, for the timer gauges read at each metrics
-- scrape: only rows with timers are in it, so the claim path and every
-- job without a timer pay nothing for it.
CREATE INDEX workflow_run_timers_queued ON workflow_run (run_after)
    WHERE status = 'QUEUED' AND timers IS NOT NULL;
