"""Submits workflow runs through Kafka with the flotilla_client package and
prints each job id once the broker has it.

    python produce.py --bootstrap 127.0.0.1:9092 [--registry http://127.0.0.1:8081] \
        --workflow order-fulfilment --count 10
"""

import argparse
import sys
import time
import uuid

from flotilla_client import KafkaSubmitter, SubmitError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--registry", help="Schema Registry URL (Avro); unset: JSON")
    parser.add_argument("--topic", default="workflow-run-requests")
    parser.add_argument("--workflow", required=True)
    parser.add_argument("--count", type=int, default=1)
    args = parser.parse_args()
    submitter = KafkaSubmitter(args.bootstrap, registry_url=args.registry, topic=args.topic)
    for n in range(1, args.count + 1):
        # Chosen here so that a retry keeps it: the fleet takes the same
        # job id twice as one job.
        job_id = uuid.uuid4()
        pause = 0.2
        while True:
            try:
                receipt = submitter.submit(args.workflow, {"n": n}, job_id=job_id)
                break
            except SubmitError as e:
                if not e.retryable:
                    print(f"produce: {e}", file=sys.stderr)
                    return 1
                print(f"produce: {e}; retrying in {pause:.1f} s", file=sys.stderr)
                time.sleep(pause)
                pause = min(pause * 2, 10)
        print(receipt.job_id, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
