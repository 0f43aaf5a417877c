"""Services and stacks the fault tests break on purpose: private Redis and Postgres servers, an API and
its workers as real processes, and probes of what a job left behind (processes, leases, files)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import func, select

from store.db import session_scope
from store.models import GpuLease, Job, JobEvent
from tests.worker.harness import ApiServer, WorkerProcess, wait_for, worker_env
from worker import launcher

GIB = 2**30
TERMINAL = {"succeeded", "failed", "cancelled"}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM,
                 timeout: float = 15) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- private servers


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the forked child only calls it
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: a test run killed outright takes its servers with it."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class RedisServer:
    """A redis-server of our own on a free port: flushing or stopping it touches no one else."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [shutil.which("redis-server") or "redis-server", "--port", str(self.port),
                "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        wait_for(self.ping, 10, f"redis-server on port {self.port}", every=0.05)
        return self

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url)

    def ping(self) -> bool:
        try:
            with contextlib.closing(self.client()) as c:
                return bool(c.ping())
        except Exception:
            return False

    def stop(self) -> None:
        stop_process(self.proc)


def pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if not found:
        raise FileNotFoundError(f"no {name} under /usr/lib/postgresql/*/bin")
    return str(found[-1])


class PgCluster:
    """A throwaway Postgres cluster (initdb + pg_ctl as user postgres) that a test may stop and start.

    Its folder is made under /tmp (pytest's temporary folders are private to root, and the server
    runs as postgres); ``remove()`` deletes it.
    """

    def __init__(self) -> None:
        import tempfile

        self.base = Path(tempfile.mkdtemp(prefix="tunebox-pg-"))
        self.data = self.base / "pgdata"
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *argv: str) -> None:
        cmd = list(argv)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def init(self) -> PgCluster:
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
        self._as_postgres(pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        return self.start()

    def start(self) -> PgCluster:
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(pg_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l",
                          str(self.base / "pg.log"), "-w", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._as_postgres(pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


# --------------------------------------------------------------------------- stacks


@dataclass
class Stack:
    """An API (``tunebox serve``) and a worker on a database and a broker, all real processes."""

    db_url: str
    broker_url: str
    data_dir: Path
    logs: Path
    overrides: dict[str, Any]
    redis: RedisServer | None = None
    on_tmpfs: bool = False
    api: ApiServer | None = None
    workers: list[WorkerProcess] = field(default_factory=list)

    def env(self, broker_url: str | None = None, **extra: Any) -> dict[str, str]:
        env = worker_env(self.db_url, broker_url or self.broker_url, self.data_dir,
                         **{**self.overrides, **extra})
        env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "DS_ACCELERATOR": "cpu"})
        return env

    def start_api(self) -> ApiServer:
        self.api = ApiServer(self.env(), self.logs / "api.log").start()
        return self.api

    def start_worker(self, **extra: Any) -> WorkerProcess:
        worker = WorkerProcess(self.env(**extra), self.logs / f"worker{len(self.workers)}.log").start()
        self.workers.append(worker)
        return worker

    @property
    def worker(self) -> WorkerProcess:
        return self.workers[-1]

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()

    def stop(self) -> None:
        self.stop_workers()
        if self.api is not None:
            self.api.stop()
        reap_owned(self.env())

    @property
    def host(self) -> str:
        return self.overrides["worker_host"]

    def client(self) -> Any:
        assert self.api is not None
        return self.api.client()

    def job_dir(self, job_id: str) -> Path:
        return self.data_dir / "jobs" / job_id

    def logs_text(self) -> str:
        parts = [w.log_text()[-3000:] for w in self.workers]
        if self.api is not None:
            parts.append(self.api.log_text()[-2000:])
        return "\n".join(parts)


def reap_owned(env: dict[str, str]) -> None:
    """Kill whatever a test's workers left running (a failing test must not leak training processes)."""
    from tests.worker.harness import settings_of
    from worker.reconcile import owned_groups

    settings = settings_of(env)
    for group in owned_groups(launcher.owner_tag(settings, settings.worker_host or "")):
        launcher.terminate_pgid(group.pgid, 2.0)


# --------------------------------------------------------------------------- specs


def lora_spec(name: str, *, max_steps: int, save_steps: int, dataset: str = "repeat.jsonl",
              fmt: str = "alpaca", micro_batch_size: int = 4, seq_len: int = 64,
              checkpointing: bool = True) -> dict[str, Any]:
    return {
        "name": name, "model": {"path": "tiny"},
        "dataset": {"path": dataset, "format": fmt, "eval_fraction": 0.05},
        "method": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": LORA_TARGETS},
        "training": {"max_steps": max_steps, "epochs": None, "learning_rate": 5e-3,
                     "lr_scheduler": "constant", "warmup_ratio": 0.0, "micro_batch_size": micro_batch_size,
                     "gradient_accumulation_steps": 1, "seq_len": seq_len, "precision": "fp32",
                     "gradient_checkpointing": checkpointing, "save_steps": save_steps, "seed": 7},
        "resources": {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "none"},
        "eval": {"when": "none"},
    }


def submit(client: Any, body: dict[str, Any], **headers: str) -> str:
    res = client.post("/v1/jobs", json=body, headers=headers)
    assert res.status_code == 201, res.text
    return str(res.json()["id"])


# --------------------------------------------------------------------------- probes


def progress(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "progress.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def checkpoint_steps(job_dir: Path) -> list[int]:
    return [int(r["step"]) for r in progress(job_dir) if r["type"] == "checkpoint"]


def job_processes(job_id: str) -> list[psutil.Process]:
    """Live processes carrying the job's marker (the launcher puts it in every process of a run)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.environ().get(launcher.ENV_JOB_ID) == job_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def lease_count(db_url: str, job_id: str | None = None) -> int:
    with session_scope(db_url) as s:
        query = select(func.count()).select_from(GpuLease)
        if job_id is not None:
            query = query.where(GpuLease.job_id == job_id)
        return int(s.scalar(query) or 0)


def events(db_url: str, job_id: str, kind: str | None = None) -> list[JobEvent]:
    with session_scope(db_url) as s:
        query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        if kind is not None:
            query = query.where(JobEvent.kind == kind)
        rows = list(s.scalars(query))
        for row in rows:
            s.expunge(row)
        return rows


def job(db_url: str, job_id: str) -> Job:
    with session_scope(db_url) as s:
        row = s.get(Job, job_id)
        assert row is not None
        s.expunge(row)
        return row


def wait_gone(job_id: str, timeout: float = 20) -> None:
    wait_for(lambda: not job_processes(job_id), timeout, f"no process of {job_id} left")


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[bool]:
    """Mount a tmpfs of ``size`` at ``path`` if this machine lets us (root); yields whether it did."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tunebox-test", str(path)],
                             capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            for _ in range(20):
                if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.5)
            else:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)


class BlackHole:
    """A TCP server that accepts and reads but never answers: a broker that hangs every send."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.conns: list[socket.socket] = []
        self._stop = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> BlackHole:
        import threading

        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            with contextlib.suppress(OSError):
                conn, _ = self.sock.accept()
                self.conns.append(conn)  # kept open, never read back to

    def close(self) -> None:
        self._stop = True
        for conn in self.conns:
            conn.close()
        self.sock.close()
