"""End-to-end load: N concurrent clients submit jobs and poll them while a GPU worker runs them.

The production layout on one machine: ``tunebox serve`` (the API) on a fresh Postgres database and a
Redis of its own, one ``tunebox worker`` taking the jobs. Each client, with a token of its own,
loops for the duration: submit a job (``Idempotency-Key``), poll it every second until it ends (also
listing its jobs and reading its events now and then), submit the next. The worker runs the
stand-in training module (``tests/worker/fake_train.py``: the real run.json/progress/checkpoint
contract, a few short steps, no torch), so the measure is of the service, not of training.

At the end (after the in-flight jobs drain) it checks: no error response, every accepted job
succeeded, one row per accepted submission, each job trained exactly once (one run, one training
start). Prints one JSON document and a markdown table of latencies per operation.

    .venv/bin/python bench/load.py --clients 50 --duration 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GIB = 2**30
TERMINAL = {"succeeded", "failed", "cancelled"}
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 384, "max_position_embeddings": 256,
              "tie_word_embeddings": False, "torch_dtype": "float32"}


@dataclass
class Record:
    """Every response the clients saw, by operation."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    errors: list[str] = field(default_factory=list)
    accepted: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    finished: dict[str, str] = field(default_factory=dict)  # job id -> final status

    def add(self, op: str, seconds: float, status: int, detail: str = "") -> None:
        self.latencies[op].append(seconds)
        self.statuses[op][status] += 1
        if status >= 400 and len(self.errors) < 50:
            self.errors.append(f"{op} {status} {detail[:300]}")


# --------------------------------------------------------------------------- the stack


def _env(tmp: Path, pg_url: str, redis_url: str, args: argparse.Namespace) -> dict[str, str]:
    values = {
        "DATABASE_URL": pg_url, "BROKER_URL": redis_url, "DATA_DIR": str(tmp / "data_dir"),
        "MODEL_ROOTS": json.dumps([str(tmp / "models")]), "DATASET_ROOTS": json.dumps([str(tmp / "data")]),
        "GPU_COUNT": str(args.gpus), "GPU_MEMORY_BYTES": str(24 * GIB), "HOST_MEMORY_BYTES": str(64 * GIB),
        "WORKER_HOST": "load-box", "WORKER_CONCURRENCY": str(args.worker_concurrency),
        "TRAIN_MODULE": "tests.worker.fake_train", "EVAL_MODULE": "tests.worker.fake_eval",
        "PROGRESS_INTERVAL_S": "1", "LEASE_WAIT_S": "1", "SUBMIT_RATE_PER_MINUTE": "100000",
        "MAX_QUEUED_JOBS_PER_USER": "100000",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEBOX_")}
    env.update({f"TUNEBOX_{k}": v for k, v in values.items()})
    env.update({"PYTHONPATH": str(REPO), "FAKE_STEP_S": str(args.step_s)})
    return env


def _prepare(tmp: Path, pg_url: str, clients: int) -> list[str]:
    """Migrate; a model folder (config only: the stand-in trainer loads nothing) and a dataset; tokens."""
    import migrations
    from api.auth.service import create_token
    from store.db import session_scope
    from tests.tinydata import write_dataset

    migrations.upgrade(pg_url)
    (tmp / "models" / "tiny").mkdir(parents=True)
    (tmp / "models" / "tiny" / "config.json").write_text(json.dumps(TINY_LLAMA))
    write_dataset(tmp / "data" / "repeat.jsonl", "alpaca", n=48)
    with session_scope(pg_url) as session:
        return [create_token(session, f"client-{i:02d}").token for i in range(clients)]


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop(proc: subprocess.Popen[bytes], grace: float = 30) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_http(url: str, timeout: float = 90) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not come up")


# --------------------------------------------------------------------------- the clients


def _spec(n: int, args: argparse.Namespace) -> dict[str, Any]:
    return {"name": f"fake:load-{n}", "model": {"path": "tiny"},
            "dataset": {"path": "repeat.jsonl", "format": "alpaca"}, "method": "lora",
            "training": {"max_steps": args.steps, "epochs": None, "seq_len": 64, "save_steps": 2,
                         "micro_batch_size": 4, "precision": "fp32"},
            "resources": {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu"},
            "eval": {"when": "none"}}


async def _call(client: Any, rec: Record, op: str, method: str, url: str, **kwargs: Any) -> Any:
    import httpx

    start = time.perf_counter()
    try:
        res = await client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        rec.add(op, time.perf_counter() - start, 599, repr(exc))
        return None
    rec.add(op, time.perf_counter() - start, res.status_code, res.text if res.status_code >= 400 else "")
    return res if res.status_code < 400 else None


async def _one_job(client: Any, rec: Record, n: int, args: argparse.Namespace) -> None:
    key = f"load-{n}-{secrets.token_hex(6)}"
    res = await _call(client, rec, "POST /v1/jobs", "POST", "/v1/jobs", json=_spec(n, args),
                      headers={"Idempotency-Key": key})
    if res is None:
        return
    job_id = res.json()["id"]
    rec.accepted[key] = job_id
    polls = 0
    while True:
        await asyncio.sleep(args.poll_s)
        polls += 1
        got = await _call(client, rec, "GET /v1/jobs/{id}", "GET", f"/v1/jobs/{job_id}")
        if polls % 5 == 0:
            await _call(client, rec, "GET /v1/jobs", "GET", "/v1/jobs?owner=me&limit=20")
            await _call(client, rec, "GET /v1/jobs/{id}/events", "GET", f"/v1/jobs/{job_id}/events?limit=50")
        status = got.json()["status"] if got is not None else None
        if status in TERMINAL:
            rec.finished[job_id] = status
            return
        if time.monotonic() > args.deadline + args.drain_s:
            return  # not finished while draining: reported below as not succeeded


async def _client(base: str, token: str, index: int, rec: Record, args: argparse.Namespace) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"},
                                 timeout=60) as client:
        await asyncio.sleep(index * args.ramp_s / max(1, args.clients))  # a ramp, not a thundering herd
        n = 0
        while time.monotonic() < args.deadline:
            await _one_job(client, rec, index * 100_000 + n, args)
            n += 1


async def _drive(base: str, tokens: list[str], args: argparse.Namespace) -> Record:
    rec = Record()
    await asyncio.gather(*(_client(base, t, i, rec, args) for i, t in enumerate(tokens)))
    return rec


# --------------------------------------------------------------------------- checks and report


def _check_database(pg_url: str, rec: Record) -> dict[str, Any]:
    from sqlalchemy import func, select

    from store.db import session_scope
    from store.models import Job, JobEvent

    with session_scope(pg_url) as s:
        rows = dict(s.execute(select(Job.id, Job.status)).all())
        attempts = Counter(s.scalars(select(Job.attempt)))
        started = select(JobEvent.job_id, func.count()).where(
            JobEvent.kind == "process", JobEvent.message.like("training started%")).group_by(JobEvent.job_id)
        starts = dict(s.execute(started).all())
    accepted = set(rec.accepted.values())
    return {
        "jobs_in_database": len(rows),
        "accepted": len(accepted),
        "rows_not_accepted": len(set(rows) - accepted),
        "accepted_without_row": len(accepted - set(rows)),
        "not_succeeded": sorted(j for j in accepted if rows.get(j) != "succeeded")[:20],
        "trained_more_than_once": sorted(j for j, n in starts.items() if n > 1)[:20],
        "never_trained": len([j for j in accepted if starts.get(j, 0) == 0]),
        "attempts": {str(k): v for k, v in sorted(attempts.items())},
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _latency_table(rec: Record, seconds: float) -> list[dict[str, Any]]:
    rows = []
    for op, values in sorted(rec.latencies.items()):
        rows.append({"operation": op, "requests": len(values), "per_s": round(len(values) / seconds, 1),
                     "p50_ms": round(_percentile(values, 0.50) * 1000, 1),
                     "p95_ms": round(_percentile(values, 0.95) * 1000, 1),
                     "p99_ms": round(_percentile(values, 0.99) * 1000, 1),
                     "max_ms": round(max(values) * 1000, 1),
                     "mean_ms": round(statistics.fmean(values) * 1000, 1),
                     "statuses": dict(rec.statuses[op])})
    return rows


def _machine() -> dict[str, Any]:
    import psutil

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    return {"cpu": cpu, "cpus": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / GIB, 1),
            "kernel": platform.release(), "python": platform.python_version(), "commit": commit}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of submitting")
    parser.add_argument("--drain-s", type=float, default=180.0, help="most seconds to let jobs finish")
    parser.add_argument("--ramp-s", type=float, default=10.0)
    parser.add_argument("--poll-s", type=float, default=1.0)
    parser.add_argument("--gpus", type=int, default=2, help="stand-in GPUs of the box")
    parser.add_argument("--worker-concurrency", type=int, default=0, help="0: two per GPU")
    parser.add_argument("--steps", type=int, default=4, help="steps of each stand-in job")
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds per stand-in step")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    args = parser.parse_args()

    from tests.conftest import create_pg_database, drop_pg_database
    from tests.reliability.support import RedisServer, free_port

    pg_url = create_pg_database("tunebox_load")
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        redis = RedisServer(tmp / "redis").start()
        tokens = _prepare(tmp, pg_url, args.clients)
        env, port = _env(tmp, pg_url, redis.url, args), free_port()
        serve = ["serve", "--host", "127.0.0.1", "--port", str(port)]
        api = _spawn([sys.executable, "-m", "tunebox.cli", *serve], env, tmp / "api.log")
        worker = _spawn([sys.executable, "-m", "tunebox.serve", "worker"], env, tmp / "worker.log")
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_http(f"{base}/readyz")
            started = time.monotonic()
            args.deadline = started + args.duration
            rec = asyncio.run(_drive(base, tokens, args))
            elapsed = time.monotonic() - started
            checks = _check_database(pg_url, rec)
        finally:
            _stop(worker)
            _stop(api)
            redis.stop()
            tails = {name: (tmp / f"{name}.log").read_text(errors="replace")[-2000:]
                     for name in ("api", "worker")}
    drop_pg_database(pg_url)

    errors = sum(n for counts in rec.statuses.values() for status, n in counts.items() if status >= 400)
    ok = (errors == 0 and not checks["not_succeeded"] and not checks["trained_more_than_once"]
          and checks["rows_not_accepted"] == 0 and checks["accepted_without_row"] == 0
          and checks["never_trained"] == 0)
    result = {"ok": ok, "clients": args.clients, "duration_s": args.duration, "elapsed_s": round(elapsed, 1),
              "stand_in_job": {"steps": args.steps, "step_s": args.step_s}, "gpus": args.gpus,
              "worker_concurrency": args.worker_concurrency or 2 * args.gpus, "error_responses": errors,
              "jobs_finished": len(rec.finished), "jobs_per_s": round(len(rec.finished) / elapsed, 2),
              "checks": checks, "latency": _latency_table(rec, elapsed), "errors": rec.errors[:20],
              "load_average_at_end": os.getloadavg(), "machine": _machine()}
    if not ok:
        result["log_tails"] = tails
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print("\n| operation | requests | req/s | p50 ms | p95 ms | p99 ms | max ms | statuses |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in result["latency"]:
        print(f"| {row['operation']} | {row['requests']} | {row['per_s']} | {row['p50_ms']} "
              f"| {row['p95_ms']} | {row['p99_ms']} | {row['max_ms']} | {row['statuses']} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
