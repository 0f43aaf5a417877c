"""Stale build locks of torch's JIT extensions (DeepSpeed's ops), found and removed.

torch builds or loads an op under ``<extensions dir>/<op>/lock``: it creates the file exclusively,
keeps it open while it runs ninja, then closes and deletes it; any other process that finds the file
sleeps until it is gone. A process killed in that window (a cancelled job's SIGKILL during start-up,
a host OOM) leaves the file behind, and every later job on the box would sleep on it forever.

A lock is stale when no process holds it open and it is older than ``MIN_AGE_S`` (a new lock is
younger: its creator is between creating and holding it). The training process runs a sweeper
thread that deletes stale locks while DeepSpeed sets up, so a wait on one ends within ``PERIOD_S``.
The same thread reports each op whose lock is held for longer than a load takes (``BUILD_AGE_S``):
an op this process is building, or one it waits for while another process builds it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

MIN_AGE_S = 10.0
PERIOD_S = 2.0
#: a lock held this long is a build (loading a built op holds it for a moment)
BUILD_AGE_S = 4.0


def extensions_root() -> Path:
    """Where torch puts JIT extensions: ``TORCH_EXTENSIONS_DIR``, else torch's default root."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    if configured:
        return Path(configured)
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def _locks(root: Path) -> list[Path]:
    # <root>/<op>/lock with TORCH_EXTENSIONS_DIR, <root>/<py_cu>/<op>/lock under the default root
    return [*root.glob("*/lock"), *root.glob("*/*/lock")]


def _lock_holders(paths: set[str]) -> dict[str, set[int]]:
    """The processes that have each of ``paths`` open (Linux: every process's /proc/PID/fd links)."""
    held: dict[str, set[int]] = {}
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            links = list(fd_dir.iterdir())
        except OSError:  # gone, or another user's
            continue
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target in paths:
                held.setdefault(target, set()).add(int(fd_dir.parent.name))
    return held


def _aged(root: Path, min_age_s: float) -> dict[str, Path]:
    now = time.time()
    old: dict[str, Path] = {}
    for lock in _locks(root):
        try:
            if now - lock.stat().st_mtime >= min_age_s:
                old[str(lock.resolve())] = lock
        except OSError:
            continue
    return old


def held_by(root: Path, pid: int) -> list[Path]:
    """The build locks under ``root`` that process ``pid`` holds open."""
    locks = {str(lock.resolve()): lock for lock in _locks(root)}
    return [locks[path] for path, pids in _lock_holders(set(locks)).items() if pid in pids]


def builds(root: Path) -> dict[str, bool]:
    """The ops being built under ``root`` now: op name -> whether this process builds it (else it
    is another process's build, which this one waits for if it needs the op)."""
    locks = _aged(root, BUILD_AGE_S)
    if not locks:
        return {}
    return {locks[path].parent.name: os.getpid() in pids for path, pids in _lock_holders(set(locks)).items()}


def remove_stale_locks(root: Path) -> list[Path]:
    """Delete the stale build locks under ``root``; returns those removed."""
    old = _aged(root, MIN_AGE_S)
    if not old:
        return []
    held = _lock_holders(set(old))
    removed = []
    for path, lock in old.items():
        if path not in held:
            try:
                lock.unlink()
            except OSError:
                continue
            removed.append(lock)
    return removed


def start_sweeper(root: Path | None = None, period_s: float = PERIOD_S,
                  on_build: Callable[[str, bool], None] | None = None) -> threading.Event:
    """Sweep ``root`` for stale locks every ``period_s`` in a daemon thread; set the event to stop.
    ``on_build(op, by_this_process)`` is called once for each op seen building."""
    stop = threading.Event()
    where = root if root is not None else extensions_root()
    reported: set[str] = set()

    def sweep_once() -> None:
        for lock in remove_stale_locks(where):
            print(f"removed a stale build lock left by a dead process: {lock}", flush=True)
        if on_build is None:
            return
        for op, mine in builds(where).items():
            if op not in reported:
                reported.add(op)
                on_build(op, mine)

    def sweep() -> None:
        while not stop.wait(period_s):
            sweep_once()

    sweep_once()  # before DeepSpeed asks for an op: it then builds or loads it itself

    threading.Thread(target=sweep, name="extension-lock-sweeper", daemon=True).start()
    return stop
