"""A real Celery worker subprocess on a real broker and database, and helpers to drive it."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select

from store.db import session_scope
from store.models import Gpu, Job
from store.states import JobStatus
from tunebox.broker import GPU_QUEUE, RUN_JOB_TASK, make_celery
from tunebox.settings import Settings

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30


def worker_env(db_url: str, broker_url: str | None, data_dir: Path, **overrides: Any) -> dict[str, str]:
    """TUNEBOX_* settings of a CPU box with one 24 GiB stand-in GPU and short timings."""
    values: dict[str, Any] = {
        "DATABASE_URL": db_url, "DATA_DIR": data_dir, "GPU_COUNT": 1, "GPU_MEMORY_BYTES": 24 * GIB,
        "HOST_MEMORY_BYTES": 16 * GIB, "WORKER_HOST": f"host-{secrets.token_hex(4)}",
        "TRAIN_MODULE": "tests.worker.fake_train", "EVAL_MODULE": "tests.worker.fake_eval",
        "CANCEL_GRACE_S": 2, "LEASE_TTL_S": 30, "PROGRESS_INTERVAL_S": 0.2, "LEASE_WAIT_S": 0.5,
        "RECONCILE_INTERVAL_S": 2, "INVENTORY_INTERVAL_S": 30, "REQUEUE_AFTER_S": 3600,
        # no background op builds beside the tests' own runs (tests/worker/test_run.py has one)
        "PREBUILD_OPS": "[]",
        # the test run's own cache of DeepSpeed's compiled ops (scripts/test sets it)
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                               str(REPO / ".cache" / "torch_extensions")),
    }
    if broker_url:
        values["BROKER_URL"] = broker_url
    values.update({k.upper(): v for k, v in overrides.items()})
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEBOX_")}
    env.update({f"TUNEBOX_{k}": str(v) for k, v in values.items()})
    env["PYTHONPATH"] = str(REPO)
    return env


def settings_of(env: dict[str, str]) -> Settings:
    """The settings the worker process reads from ``env``."""
    saved = dict(os.environ)
    try:  # read exactly as the process will: from its environment
        os.environ.clear()
        os.environ.update(env)
        return Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


class WorkerProcess:
    """``celery -A worker.celery_app worker -Q gpu --pool solo -c 1`` (or the given pool and
    concurrency) with the given environment."""

    def __init__(self, env: dict[str, str], log_path: Path, pool: str = "solo", concurrency: int = 1) -> None:
        self.env, self.log_path = env, log_path
        self.pool, self.concurrency = pool, concurrency
        self.settings = settings_of(env)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> WorkerProcess:
        argv = [sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker", "-Q", GPU_QUEUE,
                "--pool", self.pool, "-c", str(self.concurrency), "--without-gossip", "--without-mingle",
                "--loglevel", "INFO",
                "-n", f"test-{secrets.token_hex(3)}@%h"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        wait_for(self._has_inventory, timeout, f"worker ready (log: {self.log_path})")
        return self

    def _has_inventory(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited {self.proc.returncode}: {self.log_text()[-3000:]}")
        with session_scope(self.settings.resolved_database_url) as s:
            host = self.settings.worker_host
            return s.scalar(select(Gpu.id).where(Gpu.host == host).limit(1)) is not None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def kill(self) -> None:
        """The worker dies at once (its job's processes live on in their own groups)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def send(settings: Settings, job_id: str) -> None:
    """What the API does after committing a job: the run task with the job id."""
    app = make_celery(settings)
    try:
        app.send_task(RUN_JOB_TASK, args=[job_id], queue=GPU_QUEUE)
    finally:
        app.close()


def wait_for(check: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def job_row(db_url: str, job_id: str) -> Job:
    with session_scope(db_url) as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def wait_status(db_url: str, job_id: str, statuses: set[JobStatus], timeout: float = 60,
                worker: WorkerProcess | None = None) -> Job:
    def check() -> Job | None:
        job = job_row(db_url, job_id)
        return job if job.status in statuses else None

    try:
        return wait_for(check, timeout, f"job {job_id} to become {sorted(statuses)}")
    except AssertionError as exc:
        tail = worker.log_text()[-4000:] if worker else ""
        raise AssertionError(f"{exc}; now {job_row(db_url, job_id).status}\n{tail}") from None


class ApiServer:
    """``tunebox serve`` as a subprocess, plus an admin token and an HTTP client for it."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.env, self.log_path = env, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90) -> ApiServer:
        import httpx

        tunebox = [sys.executable, "-m", "tunebox.cli"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([*tunebox, "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                                         cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.log_text()[-3000:]}")
            try:
                return httpx.get(f"{self.base_url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout, f"the API on port {self.port}", every=0.5)
        made = subprocess.run([*tunebox, "token", "create", f"user-{secrets.token_hex(3)}", "--admin"],
                              env=self.env, cwd=REPO, check=True, capture_output=True, text=True)
        self.token = made.stdout.strip().splitlines()[-1]
        return self

    def client(self) -> Any:
        import httpx

        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {self.token}"},
                            timeout=30)

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def wait_job(client: Any, job_id: str, statuses: set[str], timeout: float, *logs: Any) -> dict[str, Any]:
    """Poll ``GET /v1/jobs/{id}`` until its status is one of ``statuses``."""
    last: dict[str, Any] = {}

    def check() -> bool:
        nonlocal last
        last = client.get(f"/v1/jobs/{job_id}").json()
        return last.get("status") in statuses

    try:
        wait_for(check, timeout, f"job {job_id} to become {sorted(statuses)}", every=1.0)
    except AssertionError as exc:
        tails = "\n".join(src.log_text()[-3000:] for src in logs)
        raise AssertionError(f"{exc}; last {last.get('status')} {last.get('failure')}\n"
                             f"{last.get('log_tail')}\n{tails}") from None
    return last
