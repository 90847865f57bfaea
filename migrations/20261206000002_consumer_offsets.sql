-- The offsets the fleet's consumers reached, kept beside the rows they made
-- (docs/architecture.md, "Offsets kept with the rows"). A batch's offsets
-- are written once every row of the batch committed, in a transaction of
-- their own, so the write-ahead log holds them after those rows: a
-- database that comes back without the last commits (a failover to a
-- standby that had not received them) comes back without their offsets
-- too, and a consumer newly assigned a partition rewinds to the offset
-- kept here when Kafka's committed one is ahead of it.
CREATE TABLE consumer_offset (
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);
