"""Fault 5: a training process runs out of host memory.

Two real ways: the box caps each job process's address space (``job_address_space_bytes``, an
RLIMIT_AS set by the launcher) and the real trainer's allocation fails under it; or the kernel's
OOM killer SIGKILLs the process. Either way the job fails ``host_oom``, its lease is freed, its
processes are gone and the next queued job starts.
"""

from __future__ import annotations

import os
import signal
from datetime import datetime

import pytest

from tests.reliability.support import (
    TERMINAL,
    Stack,
    job,
    job_processes,
    lease_count,
    lora_spec,
    submit,
    wait_gone,
)
from tests.worker.harness import wait_for, wait_job

pytestmark = pytest.mark.slow


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_job_over_the_address_space_cap_fails_host_oom_and_the_next_starts(real_stack: Stack) -> None:
    stack = real_stack
    # a batch of 64 sequences of 512 tokens without checkpointing, and ZeRO-3's reduce bucket pinned
    # at 5e8 fp32 elements (1.9 GiB, where the planner would size it to the adapters): more address
    # space than the cap
    big = lora_spec("over-the-cap", max_steps=3, save_steps=100, dataset="long.jsonl", fmt="text",
                    micro_batch_size=64, seq_len=512, checkpointing=False)
    big["resources"]["deepspeed"] = {"reduce_bucket_size": 500_000_000}
    small = lora_spec("queued-behind", max_steps=4, save_steps=100)
    with stack.client() as client:
        first, second = submit(client, big), submit(client, small)
        failed = wait_job(client, first, TERMINAL, 400, *stack.workers)
        lease_freed = lease_count(stack.db_url, first) == 0
        after = wait_job(client, second, TERMINAL, 400, *stack.workers)

    assert failed["status"] == "failed", failed
    assert (failed["failure"]["kind"], failed["failure"]["reason"]) == ("error", "host_oom")
    assert "can't allocate memory" in failed["failure"]["message"]
    assert lease_freed and not job_processes(first)
    assert after["status"] == "succeeded", after.get("failure")
    # one card that both cannot share: the second ran only once the first had let go of it
    assert _at(after["started_at"]) >= _at(failed["finished_at"])
    assert lease_count(stack.db_url) == 0


def test_training_killed_by_the_oom_killer_fails_host_oom(fake_stack: Stack) -> None:
    stack = fake_stack
    with stack.client() as client:
        victim = submit(client, lora_spec("fake:long", max_steps=50, save_steps=5))
        queued = submit(client, lora_spec("fake:ok", max_steps=3, save_steps=5))
        job_dir = stack.job_dir(victim)
        wait_for(lambda: (job_dir / "child.pid").exists()
                 and job(stack.db_url, victim).status.value == "running", 30, "the stand-in training to run")
        trainer = job(stack.db_url, victim).process_group
        assert trainer is not None
        os.kill(trainer, signal.SIGKILL)  # what the kernel's OOM killer does to the largest process
        failed = wait_job(client, victim, TERMINAL, 30, *stack.workers)
        after = wait_job(client, queued, TERMINAL, 30, *stack.workers)

    assert failed["status"] == "failed"
    assert (failed["failure"]["kind"], failed["failure"]["reason"]) == ("error", "host_oom")
    wait_gone(victim)  # the trainer's child, in its process group, went with it
    assert lease_count(stack.db_url, victim) == 0
    assert after["status"] == "succeeded"
