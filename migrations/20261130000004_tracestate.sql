-- W3C tracestate beside traceparent: vendor trace data the run keeps and
-- passes on (to targets and events). Nullable, no default: no table rewrite.
ALTER TABLE workflow_run ADD COLUMN tracestate TEXT;
ALTER TABLE workflow_run_outbox ADD COLUMN tracestate TEXT;
