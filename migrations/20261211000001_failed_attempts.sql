-- Each step counts its failed attempts apart: step name -> the retryable
-- failures it has had. A step's retry policy (attempts, pauses) reads its
-- own count, so two steps failing once each do not use up one budget.
-- Cleared by an operator's retry. Workers of earlier releases leave it
-- as it is and judge by the job's `attempt`, as before.
ALTER TABLE workflow_run ADD COLUMN failed_attempts jsonb NOT NULL DEFAULT '{}'::jsonb;
