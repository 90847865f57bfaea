-- Flotilla's schema: workflow definitions, the run row, and the outbox.
-- This directory is the only place the schema is defined.

-- Stored workflow definitions, versioned by name. The newest version of a
-- name serves new submissions; jobs keep the snapshot they were submitted with.
CREATE TABLE workflow_definition (
    name        TEXT        NOT NULL CHECK (btrim(name) <> ''),
    version     INTEGER     NOT NULL CHECK (version >= 1),
    definition  JSONB       NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

-- One row is the whole runtime state of one job.
CREATE TABLE workflow_run (
    job_id            UUID        PRIMARY KEY,
    workflow_name     TEXT        NOT NULL,
    -- The stored version the job was submitted against; NULL for an inline definition.
    workflow_version  INTEGER,
    definition        JSONB       NOT NULL,
    input             JSONB       NOT NULL,
    -- Digest of what the client submitted, to tell an idempotent repeat from a conflict.
    request_digest    TEXT        NOT NULL,
    status            TEXT        NOT NULL CHECK (status IN
                          ('QUEUED', 'RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')),
    attempt           INTEGER     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts      INTEGER     NOT NULL CHECK (max_attempts >= 1),
    run_after         TIMESTAMPTZ NOT NULL DEFAULT now(),
    outstanding_step  TEXT,
    -- Ordered array, one {name, skipped, response} per executed step.
    checkpoints       JSONB       NOT NULL DEFAULT '[]'::jsonb CHECK (jsonb_typeof(checkpoints) = 'array'),
    result            JSONB,
    verdict           TEXT,
    error             TEXT,
    lease_owner       TEXT,
    lease_until       TIMESTAMPTZ,
    -- Fencing token: a fresh UUID per claim, never reused (unlike attempt).
    lease_token       UUID,
    -- Last event sequence allocated for this job (events are 1, 2, 3...).
    event_sequence    BIGINT      NOT NULL DEFAULT 0,
    traceparent       TEXT,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((status = 'RUNNING') = (lease_token IS NOT NULL)),
    CHECK (status <> 'WAITING' OR outstanding_step IS NOT NULL)
);

-- The claim: oldest eligible QUEUED row first. Partial, so it holds only the queue.
CREATE INDEX workflow_run_claimable ON workflow_run (run_after, created_at)
    WHERE status = 'QUEUED';
-- The sweeper: RUNNING rows by lease expiry.
CREATE INDEX workflow_run_leased ON workflow_run (lease_until)
    WHERE status = 'RUNNING';
-- Listing newest first, optionally by status or workflow, with a (created_at, job_id) cursor.
CREATE INDEX workflow_run_newest ON workflow_run (created_at DESC, job_id DESC);
CREATE INDEX workflow_run_by_status ON workflow_run (status, created_at DESC, job_id DESC);
CREATE INDEX workflow_run_by_workflow ON workflow_run (workflow_name, created_at DESC, job_id DESC);

-- Transactional outbox: one row per commit point, written in the same
-- transaction as the run row change; the relay publishes it to Kafka.
-- A row carries everything needed to publish without reading the run row.
CREATE TABLE workflow_run_outbox (
    id               BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id         UUID        NOT NULL UNIQUE,
    job_id           UUID        NOT NULL,
    sequence         BIGINT      NOT NULL CHECK (sequence >= 1),
    event_type       TEXT        NOT NULL CHECK (event_type IN
                         ('ACCEPTED', 'STEP_CHECKPOINT', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')),
    -- The WorkflowRunEvent in its JSON form.
    payload          JSONB       NOT NULL,
    traceparent      TEXT,
    status           TEXT        NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'PUBLISHED', 'FAILED')),
    attempts         INTEGER     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error       TEXT,
    next_attempt_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at     TIMESTAMPTZ,
    UNIQUE (job_id, sequence)
);

-- The relay's drain: pending rows oldest first. Partial, so published history costs nothing.
CREATE INDEX workflow_run_outbox_pending ON workflow_run_outbox (id)
    WHERE status = 'PENDING';
-- Retention: published rows by age.
CREATE INDEX workflow_run_outbox_published ON workflow_run_outbox (published_at)
    WHERE status = 'PUBLISHED';
-- Operators list dead-lettered rows.
CREATE INDEX workflow_run_outbox_failed ON workflow_run_outbox (id)
    WHERE status = 'FAILED';
