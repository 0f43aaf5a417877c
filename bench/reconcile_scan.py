"""What the reconciler's lost-message pass costs for a long queue: finding which waiting jobs have a
message on the broker by searching each job's id in every message's text, against reading each message
once for the ids it carries (``worker.reconcile.broker_job_ids``, with ``store.ids.id_pattern``). The
messages are shaped as Celery's on Redis (JSON, the id in the headers' ``argsrepr``, the body base64).
Run on the box the figures are for:

    .venv/bin/python bench/reconcile_scan.py --messages 6000 --waiting 600 6000
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store.ids import id_pattern, new_id  # noqa: E402


def message(job_id: str) -> str:
    body = base64.b64encode(json.dumps([[job_id], {}, {}]).encode()).decode()
    headers = {"lang": "py", "task": "tunebox.run_job", "id": new_id("task"), "argsrepr": f"('{job_id}',)",
               "kwargsrepr": "{}", "origin": "gen1@" + "h" * 600}
    return json.dumps({"body": body, "headers": headers, "properties": {"priority": 0}})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=6000)
    ap.add_argument("--waiting", type=int, nargs="+", default=[600, 6000])
    args = ap.parse_args()
    job_id = id_pattern("job")
    ids = [new_id("job") for _ in range(args.messages)]
    messages = [message(i) for i in ids]
    for n in args.waiting:
        waiting = ids[:n]
        t = time.perf_counter()
        by_search = [j for j in waiting if not any(j in m for m in messages)]
        search = time.perf_counter() - t
        t = time.perf_counter()
        on_broker = {j for m in messages for j in job_id.findall(m)}
        by_ids = [j for j in waiting if j not in on_broker]
        once = time.perf_counter() - t
        assert by_search == by_ids == []
        print(f"{n} waiting jobs, {len(messages)} messages of {len(messages[0])} characters: "
              f"each id searched in every message {search:.2f} s, ids read once {once * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
