"""CPU time of one ``tunebox.broker.enqueue_job`` on a Redis broker, the run task's hand-over to the
workers that every ``POST /v1/jobs`` makes after its commit.

    .venv/bin/python bench/enqueue_cost.py --redis redis://127.0.0.1:6379/15 --sends 2000

Sends to the queue of the given Redis database (emptied before and after), after a warm-up of 50
sends, and prints the process's CPU time per send. Run it from two copies of the tree to compare
them: it imports the tree it sits in.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--sends", type=int, default=2000)
    args = parser.parse_args()
    os.environ["TUNEBOX_BROKER_URL"] = args.redis
    import redis

    from tunebox.broker import GPU_QUEUE, enqueue_job

    client = redis.Redis.from_url(args.redis)

    def empty() -> None:
        for key in client.scan_iter(match=f"{GPU_QUEUE}*"):
            client.delete(key)

    empty()
    try:
        for _ in range(50):
            enqueue_job("job_warmup", task_id=str(uuid.uuid4()))
        ids = [str(uuid.uuid4()) for _ in range(args.sends)]
        start = time.process_time()
        for task_id in ids:
            enqueue_job("job_0abc9", task_id=task_id)
        cpu = time.process_time() - start
    finally:
        empty()
    print(f"{REPO}: {cpu / args.sends * 1e6:.1f} us of CPU a send ({args.sends} sends)")


if __name__ == "__main__":
    main()
