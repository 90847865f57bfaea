-- Steps whose target is a pair of Kafka topics (docs/architecture.md,
-- "Kafka targets").
--
-- The run row keeps, per such step, its latest request:
-- {correlation_id, attempt, topic, reply_topic, deadline, reply}. `attempt`
-- is the row's attempt that sent it (a later attempt sends a new request
-- with a new correlation id); `reply` is the answer matched to it
-- ({result} or {error, retryable}), written by the reply consumer under the
-- row lock. NULL: no such step reached yet.
ALTER TABLE workflow_run ADD COLUMN step_requests jsonb;
-- While WAITING: the earliest deadline of the requests the job waits on.
-- Past it, a worker's sweep puts the job back in the queue, where the step
-- times out by the retry rules. Meaningless in any other state.
ALTER TABLE workflow_run ADD COLUMN reply_deadline timestamptz;
CREATE INDEX workflow_run_reply_deadline ON workflow_run (reply_deadline)
    WHERE status = 'WAITING' AND reply_deadline IS NOT NULL;

-- The requests to send: written in the transaction that parks the job on
-- the step, published by the relay that holds the job's bucket, deleted
-- once the broker acknowledged them. The step's request topic, the record's
-- value as JSON (the contract's WorkflowStepRequest) and its encoding.
CREATE TABLE workflow_step_request_outbox (
    id             bigserial   PRIMARY KEY,
    job_id         uuid        NOT NULL,
    step_name      text        NOT NULL,
    correlation_id uuid        NOT NULL UNIQUE,
    topic          text        NOT NULL,
    encoding       text        NOT NULL CHECK (encoding IN ('avro', 'json')),
    payload        jsonb       NOT NULL,
    traceparent    text,
    tracestate     text,
    bucket         smallint    GENERATED ALWAYS AS (get_byte(uuid_send(job_id), 15) % 64) STORED,
    attempts       integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error     text,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workflow_step_request_outbox_bucket ON workflow_step_request_outbox (bucket, id);
