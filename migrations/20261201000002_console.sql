-- What the web console's fleet view reads besides the runs and the outbox.

-- Workers announce themselves as relays do (relay_member): one row per
-- worker, refreshed by its sweeper, removed when it stops. Rows of workers
-- that died are shown as stale until they age out.
CREATE TABLE worker_member (
    worker_id    TEXT        PRIMARY KEY,
    claim_loops  INTEGER     NOT NULL CHECK (claim_loops >= 0),
    started_at   TIMESTAMPTZ NOT NULL,
    last_seen    TIMESTAMPTZ NOT NULL
);

-- Requests dead-lettered, by reason code, across the fleet and its
-- restarts (the dead-letter topic itself is the record of each one).
CREATE TABLE dead_letter_tally (
    code     TEXT        PRIMARY KEY,
    count    BIGINT      NOT NULL CHECK (count >= 0),
    last_at  TIMESTAMPTZ NOT NULL
);
