"""``tunebox serve`` and ``tunebox worker``: the processes of a deployment.

Embedded default (no broker configured): ``serve`` migrates the SQLite file, serves the API with
uvicorn and runs one worker beside it as a subprocess on the server-less filesystem broker; both stop
on SIGINT/SIGTERM. With ``TUNEBOX_BROKER_URL`` set, ``serve`` is the API only (unless
``TUNEBOX_EMBEDDED_WORKER=true``) and workers run on the GPU boxes as ``tunebox worker``.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from tunebox.settings import Settings, get_settings

log = logging.getLogger(__name__)
WORKER_STOP_GRACE_S = 10.0


def worker_argv(concurrency: int, queues: Sequence[str], settings: Settings) -> list[str]:
    """Celery worker arguments; concurrency 0 means two task slots per GPU (two jobs may share one)."""
    from tunebox.gpus import host_name, local_inventory

    if concurrency <= 0:
        concurrency = max(1, 2 * len(local_inventory(settings)))
    return ["worker", "-Q", ",".join(queues), "--concurrency", str(concurrency),
            # a task mostly waits on its training process: threads suffice and share the DB engine
            "--pool", "solo" if concurrency == 1 else "threads",
            "--hostname", f"tunebox@{host_name(settings)}",
            "--loglevel", "INFO", "--without-gossip", "--without-mingle"]


def run_worker(concurrency: int | None = None, queues: Sequence[str] = ("gpu",)) -> int:
    """Run a GPU worker in this process until it is stopped; returns the exit status.

    ``concurrency`` None takes ``Settings.worker_concurrency`` (0: two task slots per GPU).
    """
    from tunebox.broker import get_celery

    settings = get_settings()
    if concurrency is None:
        concurrency = settings.worker_concurrency
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = get_celery()
    app.loader.import_default_modules()
    app.worker_main(worker_argv(concurrency, queues, settings))
    return 0


# --------------------------------------------------------------------------- serve


class DatabaseNotReady(RuntimeError):
    """The database cannot be used as it is; the message says the one command that fixes it."""


def shown_url(url: str) -> str:
    """``url`` without its password, for messages."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def ensure_database(settings: Settings) -> None:
    """Make the database usable by this version: the embedded SQLite file is created and migrated;
    any other database must already be migrated (:class:`DatabaseNotReady` says how)."""
    from alembic.script import ScriptDirectory
    from sqlalchemy.exc import SQLAlchemyError

    import migrations

    url = settings.resolved_database_url
    try:
        if url.startswith("sqlite"):
            settings.data_dir.mkdir(parents=True, exist_ok=True)
            migrations.upgrade(url)
            return
        at = migrations.current(url)
    except (SQLAlchemyError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise DatabaseNotReady(f"cannot open the database at {shown_url(url)}: {reason}") from exc
    head = ScriptDirectory.from_config(migrations.alembic_config(url)).get_current_head()
    if at != head:
        raise DatabaseNotReady(f"the database at {shown_url(url)} is at revision {at or 'none (empty)'}, "
                               f"this tunebox needs {head}: run `tunebox db upgrade`")


def wants_embedded_worker(settings: Settings) -> bool:
    return settings.embedded_worker if settings.embedded_worker is not None else settings.embedded


class EmbeddedWorker:
    """The worker subprocess beside the API: restarted if it dies, stopped with the server.

    A worker that keeps dying (``CRASH_LIMIT`` exits, none of them after a run of
    ``HEALTHY_AFTER_S``) is restarted ever more slowly, and :meth:`problem` says why, with the
    last line it wrote on standard error: ``/readyz`` reports it and the API refuses new jobs,
    which would otherwise wait in the queue with nothing to run them.
    """

    CRASH_LIMIT = 3
    HEALTHY_AFTER_S = 30.0
    MAX_BACKOFF_S = 60.0

    def __init__(self, settings: Settings, argv: Sequence[str] | None = None) -> None:
        self.settings = settings
        self.argv = list(argv or [sys.executable, "-m", "tunebox.serve", "worker"])
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="embedded-worker", daemon=True)
        self._crashes = 0  # exits in a row, each soon after its start
        self._started_at = 0.0
        self._last_exit: int | None = None
        self._last_error = ""

    def start(self) -> None:
        self._spawn()
        self._watcher.start()

    def _spawn(self) -> None:
        # its own session: a Ctrl-C at the terminal reaches the server, which stops the worker in order
        self.proc = subprocess.Popen(self.argv, start_new_session=True, stderr=subprocess.PIPE)
        self._started_at = time.monotonic()
        threading.Thread(target=self._relay_stderr, args=(self.proc,), name="embedded-worker-stderr",
                         daemon=True).start()
        log.info("embedded worker started (pid %s)", self.proc.pid)

    def _relay_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        """Pass the worker's standard error through, keeping its last line for :meth:`problem`."""
        assert proc.stderr is not None
        for raw in proc.stderr:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.buffer.write(raw)
                sys.stderr.buffer.flush()
            if line := raw.decode("utf-8", "replace").strip():
                self._last_error = line[:300]

    def _watch(self) -> None:
        while not self.stopping.wait(1.0):
            proc = self.proc
            if proc is None or proc.poll() is None or self.stopping.is_set():
                if proc is not None and time.monotonic() - self._started_at >= self.HEALTHY_AFTER_S:
                    self._crashes = 0  # it has run long enough: it was started fine
                continue
            self._last_exit = proc.returncode
            ran_s = time.monotonic() - self._started_at
            self._crashes = self._crashes + 1 if ran_s < self.HEALTHY_AFTER_S else 1
            delay = min(self.MAX_BACKOFF_S, 2.0 ** (self._crashes - 1)) if self._crashes > 1 else 0.0
            log.error("embedded worker exited with %s after %.0f s; starting it again in %.0f s",
                      proc.returncode, ran_s, delay)
            if self.stopping.wait(delay):
                return
            self._spawn()

    def problem(self) -> str | None:
        """Why the embedded worker cannot run jobs, while it keeps dying; None while it is fine."""
        if self._crashes < self.CRASH_LIMIT:
            return None
        said = f": {self._last_error}" if self._last_error else ""
        return (f"the embedded worker exited {self._crashes} times in a row within "
                f"{self.HEALTHY_AFTER_S:.0f} s of starting (last exit status {self._last_exit}{said}); "
                "no job can run until it starts: see the server's log")

    def stop(self) -> None:
        self.stopping.set()
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WORKER_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()  # a warm shutdown waits for running jobs; they resume when the server is back
            proc.wait()
        self._reap_runs()

    def _reap_runs(self) -> None:
        """Stop the training and evaluation processes the worker left behind (they live in own groups)."""
        from tunebox.gpus import host_name
        from worker import launcher
        from worker.reconcile import owned_groups

        owner = launcher.owner_tag(self.settings, host_name(self.settings))
        for group in owned_groups(owner):
            launcher.terminate_pgid(group.pgid, self.settings.cancel_grace_s)


def _app(worker_problem: Callable[[], str | None] | None) -> Any:
    from api.app import create_app

    return create_app(worker_problem=worker_problem)


def run_serve(host: str = "127.0.0.1", port: int = 8000) -> int:
    """Serve the API (and, in the embedded mode, one worker) until SIGINT/SIGTERM."""
    import uvicorn

    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    ensure_database(settings)
    worker = EmbeddedWorker(settings) if wants_embedded_worker(settings) else None
    if worker is not None:
        worker.start()
    # uvicorn stops serving on SIGINT/SIGTERM and then raises the signal again with the handler it
    # found installed: with these, that second delivery lets the worker be stopped in order
    stop_signals: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop_signals.append(signum))
    try:
        problem = worker.problem if worker is not None else None
        uvicorn.run(partial(_app, problem), factory=True, host=host, port=port, log_level="info")
    finally:
        if worker is not None:
            worker.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args[:1] == ["worker"]:
        return run_worker(concurrency=int(args[1]) if len(args) > 1 else None)
    if args[:1] == ["serve"]:
        host = args[1] if len(args) > 1 else "127.0.0.1"
        return run_serve(host, int(args[2]) if len(args) > 2 else 8000)
    print("usage: python -m tunebox.serve worker [CONCURRENCY] | serve [HOST] [PORT]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
