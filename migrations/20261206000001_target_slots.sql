-- The cap of a Kafka target (`max_concurrent` in the targets file): how many
-- of its requests may await replies at once, across the fleet
-- (docs/architecture.md, "Kafka targets"). Each such request holds one slot,
-- taken by the segment that is about to send it, before its park commits;
-- the reply's transaction gives it back, and a slot whose deadline passed or
-- whose job ended counts no more (the next taker deletes it). No foreign
-- key: a slot is taken while its job's row is leased, and the reply
-- consumer locks that row; a key-share lock would only add waits.
CREATE TABLE workflow_target_slot (
    target     text        NOT NULL,
    job_id     uuid        NOT NULL,
    step_name  text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, step_name)
);
CREATE INDEX workflow_target_slot_target ON workflow_target_slot (target, expires_at);
