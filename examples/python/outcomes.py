"""A downstream consumer keeping a table of job outcomes, applying each
event exactly once (SQLite here, so it runs anywhere; the rule is the same
in any database with transactions).

Each job's row holds the last sequence applied, read and written in the
same transaction as the event's effect; the offset is acknowledged only
after that commit. Killed between the commit and the acknowledgement, the
consumer reads the event again, classify() calls it a repeat, nothing
changes.

    python outcomes.py --bootstrap 127.0.0.1:9092 [--registry URL] \
        --database outcomes.sqlite [--group job-outcomes] [--workflow NAME] [--until-finished N]
"""

import argparse
import json
import os
import sqlite3
import sys

from flotilla_client import EventStream, Gap, Repeat, StreamError, Undecodable, classify

SCHEMA = """CREATE TABLE IF NOT EXISTS job_outcome (
    job_id TEXT PRIMARY KEY, workflow_name TEXT NOT NULL, status TEXT NOT NULL,
    last_sequence INTEGER NOT NULL, events_applied INTEGER NOT NULL,
    gaps INTEGER NOT NULL DEFAULT 0, result TEXT, error TEXT)"""
FINISHED = "SELECT count(*) FROM job_outcome WHERE status IN ('COMPLETED', 'FAILED', 'DEAD', 'CANCELLED')"


def apply(db: sqlite3.Connection, event, gap: bool) -> bool:
    """Applies one event in one transaction; False when the table had it."""
    with db:  # one transaction: committed on leaving, rolled back on error
        row = db.execute("SELECT last_sequence FROM job_outcome WHERE job_id = ?",
                         (str(event.job_id),)).fetchone()
        if isinstance(classify(row[0] if row else None, event.sequence), Repeat):
            return False
        status = "RUNNING" if event.type.value == "STEP_CHECKPOINT" else event.type.value
        db.execute(
            """INSERT INTO job_outcome VALUES (?, ?, ?, ?, 1, ?, ?, ?)
               ON CONFLICT (job_id) DO UPDATE SET status = excluded.status,
                 last_sequence = excluded.last_sequence, events_applied = events_applied + 1,
                 gaps = gaps + excluded.gaps, result = COALESCE(excluded.result, result),
                 error = COALESCE(excluded.error, error)""",
            (str(event.job_id), event.workflow_name, status, event.sequence, int(gap),
             None if event.result is None else json.dumps(event.result), event.error))
        return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--registry")
    parser.add_argument("--topic", default="workflow-run-events")
    parser.add_argument("--group", default="job-outcomes")
    parser.add_argument("--database", required=True, help="the SQLite file")
    parser.add_argument("--instance-id", help="a static group member id (group.instance.id): "
                        "restarted with it, the consumer gets its partitions back at once")
    parser.add_argument("--workflow", help="keep only this workflow's jobs")
    parser.add_argument("--until-finished", type=int, help="stop once this many jobs have ended")
    args = parser.parse_args()
    # For the repository's test of this example: die right after a write
    # commits and before its acknowledgement, as a crash would.
    die_after = int(os.environ.get("OUTCOMES_DIE_AFTER_WRITES", "0")) or None
    db = sqlite3.connect(args.database, isolation_level=None)
    db.execute(SCHEMA)
    writes = repeats = 0
    config = {}
    if args.instance_id:
        config["group.instance.id"] = args.instance_id
    stream = EventStream(args.bootstrap, args.group, registry_url=args.registry, topic=args.topic,
                         config=config)
    while args.until_finished is None or db.execute(FINISHED).fetchone()[0] < args.until_finished:
        gap = False
        try:
            delivery = stream.poll(1.0)
        except Gap as e:
            print(f"outcomes: {e}", file=sys.stderr, flush=True)
            delivery, gap = e.delivery, True
        except Undecodable as e:
            print(f"outcomes: skipped: {e}", file=sys.stderr, flush=True)
            continue
        except StreamError as e:
            print(f"outcomes: {e}; retrying", file=sys.stderr, flush=True)
            continue
        if delivery is None:
            continue
        if args.workflow and delivery.event.workflow_name != args.workflow:
            stream.ack(delivery)  # another workflow's: nothing to keep
            continue
        if apply(db, delivery.event, gap):
            writes += 1
        else:
            repeats += 1
        if die_after == writes:
            print(f"outcomes: dying after {writes} writes, before acknowledging", file=sys.stderr, flush=True)
            os._exit(70)
        stream.ack(delivery)
    stream.commit()
    stream.close()
    print(f"outcomes: applied {writes}, repeats skipped {repeats}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
