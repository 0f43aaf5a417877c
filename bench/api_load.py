"""Load benchmark of the API: GET /v1/jobs/{id} and POST /v1/jobs with N concurrent clients.

Starts ``uvicorn api.app:create_app --factory`` (uvloop, httptools) on a fresh Postgres database
with a Redis broker and a worker's GPU heartbeat, then drives it from one asyncio process with
keep-alive connections written directly on sockets (a light client, so most of the box's CPU goes
to the server). POST bodies are all different (name and seed vary) and carry ``hardware``, so each
one is planned; the job is enqueued on Redis after its commit.

    .venv/bin/python bench/api_load.py --workers 2 --concurrency 50 --duration 20

Prints one JSON line per phase and a markdown table (the numbers in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GiB = 2**30
MODEL_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
                "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
                "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
HARDWARE = {"gpu_count": 1, "gpu_memory_bytes": 80 * GiB, "host_memory_bytes": 128 * GiB}
PINNED = {"num_gpus": 1, "zero_stage": 2, "offload_optimizer": "none", "offload_param": "none"}


# --------------------------------------------------------------------------- a light HTTP/1.1 client


@dataclass
class Stats:
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    done_at: list[float] = field(default_factory=list)  # perf_counter() when each answer came

    def add(self, seconds: float, status: int, done: float) -> None:
        self.latencies.append(seconds)
        self.done_at.append(done)
        self.statuses[status] = self.statuses.get(status, 0) + 1


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = 0
    for line in lines[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


def _request(method: str, path: str, host: str, token: str, body: bytes | None = None) -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            "Accept: application/json\r\n")
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + (body or b"")


async def _client(host: str, port: int, make: Any, start: float, end: float, stats: Stats) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while (now := time.perf_counter()) < end:
            writer.write(make())
            status = await _read_response(reader)
            done = time.perf_counter()
            if now >= start:  # requests begun during the warm-up are not counted
                stats.add(done - now, status, done)
    finally:
        writer.close()


async def drive(host: str, port: int, make: Any, concurrency: int, warmup: float, duration: float) -> Stats:
    stats = Stats()
    start = time.perf_counter() + warmup
    end = start + duration
    await asyncio.gather(*(_client(host, port, make, start, end, stats) for _ in range(concurrency)))
    return stats


async def _open_loop(host: str, port: int, make: Any, rate: float, start: float, end: float,
                     stats: Stats) -> None:
    """Requests sent at ``rate`` a second whatever the answers do (an open loop), each on an idle
    keep-alive connection or a new one; a latency runs from when the request was due, so time spent
    waiting behind a slow server counts (no coordinated omission)."""
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    opened: list[asyncio.StreamWriter] = []
    running: set[asyncio.Task[None]] = set()

    async def one(due: float) -> None:
        if idle:
            conn = idle.pop()
        else:
            conn = await asyncio.open_connection(host, port)
            opened.append(conn[1])
        conn[1].write(make())
        status = await _read_response(conn[0])
        done = time.perf_counter()
        idle.append(conn)
        if due >= start:
            stats.add(done - due, status, done)

    first, n = time.perf_counter(), 0
    while (due := first + n / rate) < end:
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        task = asyncio.create_task(one(due))
        running.add(task)
        task.add_done_callback(running.discard)
        n += 1
    await asyncio.gather(*running)
    for writer in opened:
        writer.close()


async def drive_rates(host: str, port: int, streams: dict[str, tuple[Any, float]], warmup: float,
                      duration: float) -> dict[str, Stats]:
    """Each named stream at its fixed rate, all at once."""
    start = time.perf_counter() + warmup
    end = start + duration
    stats = {name: Stats() for name in streams}
    await asyncio.gather(*(_open_loop(host, port, make, rate, start, end, stats[name])
                           for name, (make, rate) in streams.items()))
    return stats


def cpu_seconds(pids: list[int]) -> dict[str, float]:
    """CPU time used so far by the server processes, by Postgres (all backends) and by this client."""
    import psutil

    def total(procs: list[psutil.Process]) -> float:
        out = 0.0
        for proc in procs:
            try:
                times = proc.cpu_times()
                out += times.user + times.system
            except psutil.Error:
                pass
        return out

    server = [psutil.Process(pid) for pid in pids]
    server += [child for proc in list(server) for child in proc.children(recursive=True)]
    postgres = [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("postgres")]
    return {"server": total(server), "postgres": total(postgres), "client": time.process_time()}


class CpuSampler(threading.Thread):
    """The server's and Postgres's CPU seconds, sampled every ``step`` seconds from its start."""

    def __init__(self, pid: int, step: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.step, self.start_at = pid, step, time.perf_counter()
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.perf_counter(), cpu_seconds([self.pid])))
            self.done.wait(self.step)

    def report(self, by_stream: dict[str, Stats], warmup: float) -> None:
        """One JSON line per slot: each stream's p50/p99 and the cores the server and Postgres used."""
        self.done.set()
        self.join()
        start = self.start_at + warmup
        lines = {name: {row["t_s"]: row for row in timeline(st, start, self.step)}
                 for name, st in by_stream.items()}
        for (t0, c0), (t1, c1) in itertools.pairwise(self.samples):
            slot = round((t0 - start) // self.step * self.step, 1)
            row: dict[str, Any] = {"t_s": slot, **{k: round((c1[k] - c0[k]) / (t1 - t0), 2)
                                                   for k in ("server", "postgres")}}
            for name, rows in lines.items():
                if slot in rows:
                    row[name] = {k: v for k, v in rows[slot].items() if k != "t_s"}
            print(json.dumps({"timeline": row}), flush=True)


def timeline(stats: Stats, start: float, step: float) -> list[dict[str, Any]]:
    """p50 and p99 of the answers that came in each ``step`` seconds from ``start``."""
    slots: dict[int, list[float]] = {}
    for lat, done in zip(stats.latencies, stats.done_at, strict=True):
        slots.setdefault(int((done - start) // step), []).append(lat)
    out = []
    for slot in sorted(slots):
        lat = sorted(slots[slot])
        out.append({"t_s": round(slot * step, 1), "n": len(lat),
                    "p50_ms": percentile_ms(lat, 0.50), "p99_ms": percentile_ms(lat, 0.99)})
    return out


def percentile_ms(ordered: list[float], p: float) -> float:
    """The ``p`` quantile of latencies in seconds, sorted, in milliseconds (nan for none)."""
    if not ordered:
        return float("nan")
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 1)


def summarize(name: str, stats: Stats, duration: float,
              cpu: dict[str, float] | None = None) -> dict[str, Any]:
    lat = sorted(stats.latencies)
    return {"phase": name, "requests": len(lat), "rps": round(len(lat) / duration, 1),
            **{f"p{round(p * 100)}_ms": percentile_ms(lat, p) for p in (0.50, 0.95, 0.99)},
            "mean_ms": round(statistics.fmean(lat) * 1000, 1) if lat else None,
            "statuses": stats.statuses,
            # CPU per counted request (warm-up requests are included in the CPU, so this errs high)
            **{f"{k}_cpu_ms_per_req": round(v / max(1, len(lat)) * 1000, 2) for k, v in (cpu or {}).items()}}


# --------------------------------------------------------------------------- setting up the service


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prepare(tmp: Path, pg_url: str, users: int = 1) -> tuple[list[str], str]:
    """Migrate, create ``users`` users with a token each, a model folder and a dataset (shared where
    there are several users); return (the tokens, the dataset's id)."""
    import migrations
    from api.auth.service import create_token
    from store.db import session_scope
    from store.models import Dataset

    migrations.upgrade(pg_url)
    (tmp / "models" / "small").mkdir(parents=True)
    (tmp / "models" / "small" / "config.json").write_text(json.dumps(MODEL_CONFIG))
    (tmp / "data").mkdir()
    data = tmp / "data" / "train.jsonl"
    data.write_text('{"instruction": "hi", "output": "hello"}\n' * 1000)
    with session_scope(pg_url) as session:
        issued = [create_token(session, f"bench{i}" if i else "bench") for i in range(users)]
        session.add(Dataset(id="ds_bench", owner_id=issued[0].user.user_id, name="bench", path=str(data),
                            format="alpaca", num_rows=1000, size_bytes=data.stat().st_size, sha256="0" * 64,
                            shared=users > 1))
    return [i.token for i in issued], "ds_bench"


class WorkerHeartbeat(threading.Thread):
    """What a running worker's housekeeping writes each ``inventory_interval_s``: its box's GPU rows.
    A box serving jobs has one, and the API reads its last report on every submission."""

    def __init__(self, pg_url: str) -> None:
        from tunebox.settings import Settings

        super().__init__(daemon=True)
        self.settings = Settings(database_url=pg_url, gpu_count=1, gpu_memory_bytes=80 * GiB)
        self.done = threading.Event()

    def run(self) -> None:
        from store.db import session_scope
        from tunebox.gpus import sync_inventory

        while True:
            with session_scope(self.settings.resolved_database_url) as session:
                sync_inventory(session, self.settings)
            if self.done.wait(self.settings.inventory_interval_s):
                return


def start_server(tmp: Path, pg_url: str, redis_url: str, port: int, workers: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TUNEBOX_DATABASE_URL": pg_url, "TUNEBOX_BROKER_URL": redis_url,
           "TUNEBOX_DATA_DIR": str(tmp / "data_dir"),
           "TUNEBOX_MODEL_ROOTS": json.dumps([str(tmp / "models")]),
           "TUNEBOX_DATASET_ROOTS": json.dumps([str(tmp / "data")]),
           "TUNEBOX_SUBMIT_RATE_PER_MINUTE": "100000000", "TUNEBOX_MAX_QUEUED_JOBS_PER_USER": "100000000"}
    cmd = [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host", "127.0.0.1",
           "--port", str(port), "--workers", str(workers), "--loop", "uvloop", "--http", "httptools",
           "--no-access-log", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                if b"200" in sock.recv(100):
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def spec_maker(dataset_id: str, pinned: bool) -> Any:
    counter = iter(range(10**9))

    def body() -> bytes:
        n = next(counter)
        training: dict[str, Any] = {"max_steps": 100, "seq_len": 1024, "seed": n % 2**31}
        if pinned:
            training.update(micro_batch_size=4, gradient_checkpointing=True)
        spec: dict[str, Any] = {"name": f"bench-{n}", "model": {"path": "small"},
                                "dataset": {"id": dataset_id}, "method": "lora", "hardware": HARDWARE,
                                "training": training}
        if pinned:
            spec["resources"] = PINNED
        return json.dumps(spec).encode()

    return body


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import psutil

    return {"cpus": os.cpu_count(), "cpu": cpu, "ram_gib": round(psutil.virtual_memory().total / GiB, 1),
            "python": platform.python_version(), "kernel": platform.release()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--phases", default="get,post,post-auto")
    parser.add_argument("--rates", default="get=500,post=100",
                        help="the mixed phase's offered load: requests a second per phase")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--users", type=int, default=1,
                        help="submit as this many users in turn (each user's queued jobs are counted "
                             "against the queue limit on every submission)")
    parser.add_argument("--timeline", type=float, default=0.0, metavar="SECONDS",
                        help="also print the mixed phase's p50/p99 and the CPU the server and Postgres used "
                             "in each slot of this many seconds")
    args = parser.parse_args()

    import redis

    from tests.conftest import create_pg_database, drop_pg_database

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    pg_url = create_pg_database("tunebox_bench")
    redis_url = f"{args.redis}/{secrets.randbelow(14) + 1}"
    redis.Redis.from_url(redis_url).flushdb()
    port = _free_port()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        tokens, dataset_id = prepare(tmp, pg_url, args.users)
        token = tokens[0]  # the first job's owner: every GET reads that job
        submitters = itertools.cycle(tokens)
        heartbeat = WorkerHeartbeat(pg_url)
        heartbeat.start()
        proc = start_server(tmp, pg_url, redis_url, port, args.workers)
        try:
            host = f"127.0.0.1:{port}"
            first = asyncio.run(_post_once(port, _request("POST", "/v1/jobs", host, token,
                                                           spec_maker(dataset_id, True)())))
            job_path = f"/v1/jobs/{first}"
            phases = {
                "healthz": lambda: _request("GET", "/healthz", host, token),
                "list": lambda: _request("GET", "/v1/jobs?limit=20", host, token),
                "get": lambda: _request("GET", job_path, host, token),
                "post": (lambda make: lambda: _request("POST", "/v1/jobs", host, next(submitters), make()))(
                    spec_maker(dataset_id, True)),
                "post-auto": (lambda make: lambda: _request("POST", "/v1/jobs", host, next(submitters),
                                                            make()))(
                    spec_maker(dataset_id, False)),
            }
            rates = {k: float(v) for k, v in (item.split("=") for item in args.rates.split(","))}
            for name in args.phases.split(","):
                if name == "mixed":  # a fixed offered load of GETs and POSTs together
                    before = cpu_seconds([proc.pid])
                    streams = {f"mixed-{k}": (phases[k], rate) for k, rate in rates.items()}
                    sampler = CpuSampler(proc.pid, args.timeline) if args.timeline else None
                    by_stream = asyncio.run(drive_rates("127.0.0.1", port, streams, args.warmup,
                                                        args.duration))
                    after = cpu_seconds([proc.pid])
                    if sampler:
                        sampler.report(by_stream, args.warmup)
                    served = sum(len(st.latencies) for st in by_stream.values())
                    for stream, stats in by_stream.items():
                        results.append(summarize(stream, stats, args.duration))
                        # the server's CPU over every request of the phase, GETs and POSTs together
                        results[-1]["server_cpu_ms_per_req_all"] = round(
                            (after["server"] - before["server"]) / max(1, served) * 1000, 2)
                        print(json.dumps(results[-1]), flush=True)
                    continue
                before = cpu_seconds([proc.pid])
                stats = asyncio.run(drive("127.0.0.1", port, phases[name], args.concurrency,
                                          args.warmup, args.duration))
                after = cpu_seconds([proc.pid])
                used = {k: after[k] - before[k] for k in before}
                results.append(summarize(name, stats, args.duration, used))
                print(json.dumps(results[-1]), flush=True)
            queued = _messages_on_gpu_queue(redis_url)
        finally:
            stop_server(proc)
            heartbeat.done.set()
            heartbeat.join()
    drop_pg_database(pg_url)
    redis.Redis.from_url(redis_url).flushdb()
    info = {"load_average_at_end": os.getloadavg(), "workers": args.workers,
            "concurrency": args.concurrency, "duration_s": args.duration,
            "messages_on_redis_gpu_queue": queued, "machine": machine()}
    print(json.dumps(info))
    print("\n| phase | req/s | p50 ms | p95 ms | p99 ms | server CPU ms/req | Postgres CPU ms/req "
          "| statuses |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['phase']} | {r['rps']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} "
              f"| {r.get('server_cpu_ms_per_req')} | {r.get('postgres_cpu_ms_per_req')} | {r['statuses']} |")
    return 0


def _messages_on_gpu_queue(redis_url: str) -> int:
    import redis

    client = redis.Redis.from_url(redis_url)
    # Celery's Redis transport keeps one list per priority: "gpu", "gpu\x06\x163", ...
    return sum(int(client.llen(key)) for key in client.scan_iter(match="gpu*") if client.type(key) == b"list")


async def _post_once(port: int, raw: bytes) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line[15:]) for line in head.split(b"\r\n") if line[:15].lower() == b"content-length:")
    body = json.loads(await reader.readexactly(length))
    writer.close()
    if "id" not in body:
        raise SystemExit(f"the first POST failed: {body}")
    return str(body["id"])


if __name__ == "__main__":
    sys.exit(main())
