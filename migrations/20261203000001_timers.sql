-- Timers of a graph run: step name -> the instant (RFC 3339) it wakes at,
-- set when the run first reached the timer and never moved after, so a
-- restart or a lapsed lease does not start the wait again. NULL: none.
ALTER TABLE workflow_run ADD COLUMN timers jsonb;
