"""Stale build locks of torch's JIT extensions: which are removed, which are left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from worker._trainlib import extlocks


def _lock(root: Path, op: str, age_s: float) -> Path:
    path = root / op / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_only_old_locks_no_process_holds_open_are_removed(tmp_path: Path) -> None:
    dead = _lock(tmp_path, "cpu_adam", age_s=3600)  # its builder was killed long ago
    fresh = _lock(tmp_path, "fused_adam", age_s=0)  # just created: its builder is about to hold it
    held = _lock(tmp_path, "deepspeed_shm_comm", age_s=3600)  # a long build, still running
    nested = _lock(tmp_path / "py311_cpu", "cpu_lion", age_s=3600)  # torch's default layout
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); "
                               "print('open', flush=True); time.sleep(60)", str(held)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        removed = extlocks.remove_stale_locks(tmp_path)
        assert sorted(removed) == sorted([dead, nested])
        assert not dead.exists() and not nested.exists() and fresh.exists() and held.exists()
    finally:
        holder.kill()
        holder.wait()
    # once its holder is gone, the old lock is stale too
    assert extlocks.remove_stale_locks(tmp_path) == [held]


def test_sweeper_removes_a_lock_that_goes_stale_while_it_runs(tmp_path: Path) -> None:
    lock = _lock(tmp_path, "cpu_adam", age_s=extlocks.MIN_AGE_S - 0.5)  # not stale yet
    stop = extlocks.start_sweeper(tmp_path, period_s=0.1)
    try:
        assert lock.exists()  # the first sweep, at start, left it
        deadline = time.monotonic() + 10
        while lock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not lock.exists()
    finally:
        stop.set()


def test_an_op_held_longer_than_a_load_is_reported_once_with_whose_build_it_is(tmp_path: Path) -> None:
    theirs = _lock(tmp_path, "cpu_adam", age_s=extlocks.BUILD_AGE_S + 1)  # another process builds it
    mine = _lock(tmp_path, "fused_adam", age_s=extlocks.BUILD_AGE_S + 1)  # this process builds it
    loading = _lock(tmp_path, "cpu_lion", age_s=0)  # held for a moment: a load, not a build
    _lock(tmp_path, "deepspeed_shm_comm", age_s=3600)  # held by no one: not a build at all
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; fs = [open(p) for p in sys.argv[1:]];"
                               " print('open', flush=True); time.sleep(60)", str(theirs), str(loading)],
                              stdout=subprocess.PIPE, text=True)
    reports: list[tuple[str, bool]] = []
    with mine.open():
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
            assert extlocks.builds(tmp_path) == {"cpu_adam": False, "fused_adam": True}
            stop = extlocks.start_sweeper(tmp_path, period_s=0.05, on_build=lambda op, by_me:
                                          reports.append((op, by_me)))
            time.sleep(0.5)  # ten sweeps
            stop.set()
        finally:
            holder.kill()
            holder.wait()
    assert sorted(reports) == [("cpu_adam", False), ("fused_adam", True)]


def test_the_locks_one_process_holds(tmp_path: Path) -> None:
    theirs = _lock(tmp_path, "cpu_adam", age_s=0)
    mine = _lock(tmp_path, "fused_adam", age_s=0)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); "
                               "print('open', flush=True); time.sleep(60)", str(theirs)],
                              stdout=subprocess.PIPE, text=True)
    with mine.open():
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
            assert extlocks.held_by(tmp_path, holder.pid) == [theirs]
            assert extlocks.held_by(tmp_path, os.getpid()) == [mine]
        finally:
            holder.kill()
            holder.wait()
    assert extlocks.held_by(tmp_path, holder.pid) == []
