-- The relay's ownership of the outbox: job ids fall into 64 buckets, and a
-- bucket is leased to one relay at a time, so one job's events are published
-- by one relay, in sequence order, even with several relays running.

ALTER TABLE workflow_run_outbox
    ADD COLUMN bucket SMALLINT GENERATED ALWAYS AS (get_byte(uuid_send(job_id), 15) % 64) STORED;

DROP INDEX workflow_run_outbox_pending;
CREATE INDEX workflow_run_outbox_pending ON workflow_run_outbox (bucket, id)
    WHERE status = 'PENDING';

-- Relays alive, by heartbeat; the fair share of buckets is 64 / live relays.
CREATE TABLE relay_member (
    relay_id   TEXT        PRIMARY KEY,
    last_seen  TIMESTAMPTZ NOT NULL
);

-- Who publishes which bucket, until when.
CREATE TABLE relay_bucket (
    bucket       SMALLINT    PRIMARY KEY CHECK (bucket >= 0 AND bucket < 64),
    owner        TEXT,
    lease_until  TIMESTAMPTZ
);
INSERT INTO relay_bucket (bucket) SELECT generate_series(0, 63);
