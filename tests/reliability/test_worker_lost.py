"""Fault 1: the Celery worker is killed (SIGKILL) in the middle of a training run.

The training lives on in its own process group (nothing else would stop it mid-step); the worker
that takes the box over (a restarted service, or another worker of the host) reconciles at start-up:
the job is queued again and resumes from its last checkpoint, or fails ``worker_lost`` when it has
no runs left; the orphaned processes are ended and the GPU lease freed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.reliability.support import (
    TERMINAL,
    Stack,
    checkpoint_steps,
    events,
    job,
    job_processes,
    lease_count,
    lora_spec,
    progress,
    submit,
    wait_gone,
)
from tests.worker.harness import wait_for, wait_job
from worker import launcher

pytestmark = pytest.mark.slow
RECOVERY_S = 60
STEPS = 150


def _kill_worker_mid_run(stack: Stack, job_id: str, ready: object) -> tuple[int, float]:
    """SIGKILL the worker running ``job_id`` once ``ready()``; returns its run's group and the time."""
    wait_for(ready, 480, f"{job_id} mid-run", every=0.1)
    row = job(stack.db_url, job_id)
    assert row.worker_pid == stack.worker.proc.pid and row.process_group  # type: ignore[union-attr]
    stack.worker.kill()
    killed_at = time.monotonic()
    # nothing ends the run with its worker: it trains on, holding the card, until reconciled
    time.sleep(1.0)
    assert launcher.group_alive(row.process_group)
    assert job(stack.db_url, job_id).status.value == "running"
    return row.process_group, killed_at


def _wait_recovered(stack: Stack, job_id: str, killed_at: float) -> float:
    def recovered() -> bool:
        return any(e.actor == "reconciler" for e in events(stack.db_url, job_id, "status"))

    wait_for(recovered, RECOVERY_S, f"the reconciler to take {job_id} back")
    return time.monotonic() - killed_at


def test_killed_worker_job_resumes_from_its_checkpoint(real_stack: Stack) -> None:
    stack = real_stack
    with stack.client() as client:
        job_id = submit(client, lora_spec("resume-after-kill", max_steps=STEPS, save_steps=10))
        job_dir = stack.job_dir(job_id)
        pgid, killed_at = _kill_worker_mid_run(stack, job_id, lambda: checkpoint_steps(job_dir))
        first_pids = {p.pid for p in job_processes(job_id)}
        assert first_pids and all(os.getpgid(pid) == pgid for pid in first_pids)

        stack.start_worker()  # the service restarted: it reconciles before taking work
        took = _wait_recovered(stack, job_id, killed_at)
        done = wait_job(client, job_id, TERMINAL, 480, *stack.workers)

    assert took < RECOVERY_S
    assert (done["status"], done["attempt"]) == ("succeeded", 2), done.get("failure")
    requeue = next(e for e in events(stack.db_url, job_id, "status") if e.actor == "reconciler")
    assert requeue.data["to"] == "queued" and "run 1 of 3 lost" in requeue.message
    killed = [e.message for e in events(stack.db_url, job_id, "reconcile")]
    assert f"killed leftover train processes (group {pgid})" in killed

    records = progress(job_dir)
    starts = [r for r in records if r["type"] == "start"]
    assert len(starts) == 2 and starts[0]["start_step"] == 0
    resumed = starts[1]
    assert 0 < resumed["start_step"] < STEPS, resumed
    assert Path(resumed["resumed_from"]).name == f"step-{resumed['start_step']}"
    second_run = [r["step"] for r in records[records.index(resumed):] if r["type"] == "progress"]
    assert second_run == list(range(resumed["start_step"] + 1, STEPS + 1))  # continued, not restarted
    assert records[-1]["type"] == "done" and records[-1]["step"] == STEPS
    assert done["progress"]["step"] == STEPS

    assert not any(p.pid in first_pids for p in job_processes(job_id))
    assert not launcher.group_alive(pgid)
    wait_gone(job_id)
    assert lease_count(stack.db_url, job_id) == 0


def test_killed_worker_without_runs_left_fails_worker_lost(fake_stack: Stack) -> None:
    stack = fake_stack
    stack.stop_workers()
    stack.start_worker(max_attempts=1)
    try:
        with stack.client() as client:
            job_id = submit(client, {**lora_spec("fake:long", max_steps=50, save_steps=5)})
            job_dir = stack.job_dir(job_id)
            # the stand-in's run: a training process and a child of it, one process group
            pgid, killed_at = _kill_worker_mid_run(stack, job_id, lambda: (
                (job_dir / "child.pid").exists() and job(stack.db_url, job_id).status.value == "running"))
            child = int((job_dir / "child.pid").read_text())
            assert os.getpgid(child) == pgid

            stack.start_worker(max_attempts=1)
            took = _wait_recovered(stack, job_id, killed_at)
            done = wait_job(client, job_id, TERMINAL, 30, *stack.workers)
    finally:
        stack.stop_workers()
        stack.start_worker()

    assert took < RECOVERY_S
    assert (done["status"], done["attempt"]) == ("failed", 1)
    assert done["failure"]["kind"] == "error" and done["failure"]["reason"] == "worker_lost"
    assert "1 of 1 runs used" in done["failure"]["message"]
    wait_gone(job_id)
    assert not launcher.group_alive(pgid)
    assert lease_count(stack.db_url, job_id) == 0
