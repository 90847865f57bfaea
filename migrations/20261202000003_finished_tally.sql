-- Jobs finished per minute and final state, across the fleet: each worker
-- counts the jobs it finishes and adds its counts here on every sweeper
-- tick, so the console's chart of the last hour reads a few rows instead of
-- an hour of events (which at a few hundred jobs a second is a million).
CREATE TABLE finished_tally (
    minute  TIMESTAMPTZ NOT NULL,
    status  TEXT        NOT NULL CHECK (status IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')),
    count   BIGINT      NOT NULL CHECK (count >= 0),
    PRIMARY KEY (minute, status)
);
