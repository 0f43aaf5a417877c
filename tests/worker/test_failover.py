"""A worker dies mid-run: another worker of the box notices, kills the orphaned run, runs it again."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from store.db import session_scope
from store.states import JobStatus
from tests.worker.factories import job_spec, make_job, make_user
from tests.worker.harness import WorkerProcess, job_row, send, wait_for, wait_status, worker_env

S = JobStatus


@pytest.fixture
def two_workers(db_url, redis_url, tmp_path):
    env = worker_env(db_url, redis_url, tmp_path, reconcile_interval_s=1)
    workers = [WorkerProcess(env, tmp_path / f"worker{i}.log").start() for i in range(2)]
    yield workers
    for w in workers:
        w.stop()


def test_lost_worker_job_is_requeued_and_its_orphan_killed(two_workers, db_url):
    settings = two_workers[0].settings
    spec = job_spec(name="fake:ok", training={"max_steps": 40, "epochs": None, "seq_len": 32,
                                              "save_steps": 10})
    with session_scope(db_url) as s:
        job_id = make_job(s, make_user(s), spec=spec, peak=None).id
    send(settings, job_id)
    job = wait_status(db_url, job_id, {S.RUNNING})
    wait_for(lambda: Path(job.job_dir, "pids.txt").exists(), 10, "the training to start")
    first_run = int(Path(job.job_dir, "pids.txt").read_text().split()[0])
    victim = next(w for w in two_workers if w.proc is not None and w.proc.pid == job.worker_pid)
    victim.kill()
    assert psutil.pid_exists(first_run)  # its training lives on in its own process group
    done = wait_status(db_url, job_id, {S.SUCCEEDED, S.FAILED}, timeout=90)
    assert (done.status, done.attempt) == (S.SUCCEEDED, 2)
    assert not psutil.pid_exists(first_run) or psutil.Process(first_run).status() == psutil.STATUS_ZOMBIE
    assert job_row(db_url, job_id).worker_pid != job.worker_pid
