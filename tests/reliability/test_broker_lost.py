"""Fault 2: the broker loses its queue (Redis FLUSHDB while jobs wait and no worker runs).

The database is the truth: a worker that starts finds queued jobs with no message on the broker and
sends them again; each job's training starts exactly once.
"""

from __future__ import annotations

import pytest

from tests.reliability.support import TERMINAL, Stack, events, job, lora_spec, progress, submit
from tests.worker.harness import wait_for, wait_job

pytestmark = pytest.mark.slow


def _queue_keys(stack: Stack) -> list[bytes]:
    assert stack.redis is not None
    with stack.redis.client() as r:
        return [k for k in r.scan_iter(match="gpu*") if r.type(k) == b"list" and r.llen(k)]


def test_flushed_queue_is_sent_again_from_the_database_and_nothing_runs_twice(fake_stack: Stack) -> None:
    stack = fake_stack
    assert stack.redis is not None
    stack.stop_workers()
    try:
        with stack.client() as client:
            waiting = [submit(client, lora_spec("fake:ok", max_steps=3, save_steps=5)) for _ in range(3)]
            wait_for(lambda: _queue_keys(stack), 10, "the messages on the broker")
            with stack.redis.client() as r:
                r.flushdb()
                assert r.dbsize() == 0
            stack.start_worker(requeue_after_s=1)
            # the API's connection to the broker outlived the flush: a job sent now must run too
            later = submit(client, lora_spec("fake:ok", max_steps=3, save_steps=5))
            finished = {j: wait_job(client, j, TERMINAL, 60, *stack.workers) for j in [*waiting, later]}
    finally:
        stack.stop_workers()
        stack.start_worker()

    assert {j: f["status"] for j, f in finished.items()} == dict.fromkeys(finished, "succeeded")
    for job_id in finished:
        assert job(stack.db_url, job_id).attempt == 1
        started = [e for e in events(stack.db_url, job_id, "process") if "training started" in e.message]
        assert len(started) == 1, started
        assert [r["type"] for r in progress(stack.job_dir(job_id))].count("start") == 1
        assert (stack.job_dir(job_id) / "pids.txt").read_text().count("\n") == 1
    for job_id in waiting:
        resent = [e.message for e in events(stack.db_url, job_id, "reconcile")]
        assert "the job's message was not on the broker; sent again" in resent
