-- A slot of a capped Kafka target belongs to one request: only the reply to
-- that request's correlation id gives it back, so a late reply to an
-- earlier attempt of the step frees nothing. Slots held now belong to no
-- known request; they are dropped (each was at most one request's, and its
-- step takes a new one at its next attempt).
DELETE FROM workflow_target_slot;
ALTER TABLE workflow_target_slot ADD COLUMN correlation_id uuid NOT NULL;
