-- A request's priority, 0 to 10: kept for readers; its effect is the head
-- start it gave the job's first run_after (a minute per point), so the
-- claim's order, and its index, are as they were.
ALTER TABLE workflow_run ADD COLUMN priority smallint NOT NULL DEFAULT 0;
