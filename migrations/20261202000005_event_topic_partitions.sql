-- The event topic's partition count as the relays last agreed on it. A
-- job's events stay in order because its key always maps to one partition;
-- adding partitions moves keys, so a relay that finds a count other than
-- the one recorded here stops publishing until an operator accepts it
-- (FLOTILLA_ACCEPT_PARTITION_CHANGE), which records the new count.
CREATE TABLE event_topic (
    topic        TEXT        PRIMARY KEY,
    partitions   INTEGER     NOT NULL CHECK (partitions >= 1),
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
