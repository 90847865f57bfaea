-- Signals sent to a job (docs/architecture.md, "Signals"): the newest 100,
-- oldest first, each {seq, name, idempotency_key, digest, payload, source,
-- received_at, consumed_by, consumed_at}. A `wait_for` step takes the
-- oldest unconsumed signal of its name. NULL: none ever sent.
ALTER TABLE workflow_run ADD COLUMN signals jsonb;
-- Events written for this job by someone other than its lease holder while
-- it may be running (a signal received). The holder's fence compares
-- `event_sequence - foreign_events` with the sequence its own writes have
-- reached, so a signal arriving mid-segment never stops the segment, and a
-- write repeated after an ambiguous commit still matches nothing.
ALTER TABLE workflow_run ADD COLUMN foreign_events integer NOT NULL DEFAULT 0 CHECK (foreign_events >= 0);
