"""The reconciler on Postgres and Redis: lost jobs, orphaned process groups, lost messages."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import redis
from sqlalchemy import delete, select, update

from store.base import utcnow
from store.db import session_scope
from store.models import Gpu, GpuLease, Job, JobEvent
from store.states import JobStatus, transition
from tests.worker.factories import make_job, make_user
from tests.worker.harness import worker_env
from tunebox import gpus
from tunebox.broker import get_celery
from tunebox.settings import Settings, get_settings
from worker import launcher, leasing, reconcile

S = JobStatus


@pytest.fixture
def settings(db_url, redis_url, tmp_path, monkeypatch):
    """This process as a worker of host ``rec-host`` on Redis (the reconciler enqueues through it)."""
    env = worker_env(db_url, redis_url, tmp_path, worker_host="rec-host", max_attempts=2, gpu_count=4,
                     requeue_after_s=60)
    for key, value in env.items():
        if key.startswith("TUNEBOX_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setattr(gpus, "_nvml_inventory", lambda: [])
    get_settings.cache_clear()
    get_celery.cache_clear()
    redis.Redis.from_url(redis_url).flushdb()
    settings = get_settings()
    with session_scope(db_url) as s:
        s.execute(delete(GpuLease))
        s.execute(delete(Gpu))
        s.execute(update(Job).where(Job.status.not_in(["succeeded", "failed", "cancelled"]))
                  .values(status="cancelled"))
        gpus.sync_inventory(s, settings)
    yield settings
    get_settings.cache_clear()
    get_celery.cache_clear()


def _running_job(settings: Settings, *, attempt: int = 1, status: S = S.RUNNING,
                 lease_expired: bool = True, worker_pid: int | None = None) -> str:
    url = settings.resolved_database_url
    with session_scope(url) as s:
        job = make_job(s, make_user(s), peak=None)
        grant = leasing.try_acquire(s, job, "rec-host", settings)
        assert grant is not None
        transition(s, job.id, S.STARTING, worker_host="rec-host", attempt=attempt,
                   worker_pid=worker_pid or os.getpid())
        if status is not S.STARTING:
            transition(s, job.id, S.RUNNING)
        if status in (S.EVALUATING, S.CANCELLING):
            transition(s, job.id, status)
        if lease_expired:
            s.execute(update(GpuLease).where(GpuLease.job_id == job.id)
                      .values(expires_at=utcnow() - timedelta(seconds=1)))
        return job.id


def _job(settings: Settings, job_id: str) -> Job:
    with session_scope(settings.resolved_database_url) as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def _on_broker(settings: Settings, job_id: str) -> bool:
    return any(job_id in m for m in reconcile.broker_messages(settings))


def _leases(settings: Settings, job_id: str) -> list[int]:
    with session_scope(settings.resolved_database_url) as s:
        return list(s.scalars(select(GpuLease.id).where(GpuLease.job_id == job_id)))


def test_expired_lease_requeues_the_job_and_sends_it_again(settings):
    job_id = _running_job(settings)
    report = reconcile.reconcile_once(settings)
    assert report.requeued == [job_id]
    job = _job(settings, job_id)
    assert (job.status, job.attempt, job.worker_host) == (S.QUEUED, 1, None)
    assert _leases(settings, job_id) == [] and _on_broker(settings, job_id)


def test_lost_job_without_runs_left_fails_worker_lost(settings):
    job_id = _running_job(settings, attempt=2)
    assert reconcile.reconcile_once(settings).failed == [job_id]
    job = _job(settings, job_id)
    assert (job.status, job.failure_kind, job.failure_reason) == (S.FAILED, "error", "worker_lost")
    assert not _on_broker(settings, job_id)


def test_lost_while_cancelling_or_evaluating(settings):
    cancelling = _running_job(settings, status=S.CANCELLING)
    evaluating = _running_job(settings, status=S.EVALUATING)
    report = reconcile.reconcile_once(settings)
    assert (report.cancelled, report.succeeded) == ([cancelling], [evaluating])
    job = _job(settings, evaluating)
    assert job.status is S.SUCCEEDED and job.eval_result["reason"] == "worker_lost"


def test_dead_worker_on_this_host_is_noticed_before_its_lease_expires(settings):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    job_id = _running_job(settings, lease_expired=False, worker_pid=dead.pid)
    alive = _running_job(settings, lease_expired=False)  # this process is its worker
    report = reconcile.reconcile_once(settings)
    assert report.requeued == [job_id]
    assert _job(settings, alive).status is S.RUNNING


def test_orphaned_process_group_of_a_finished_job_is_killed(settings):
    job_id = _running_job(settings, lease_expired=False)
    grant = leasing.Grant(gpu_ids=(0,), indices=(0,), uuids=("cpu-0",), exclusive=True)
    run = launcher.RunId(job_id, 1, launcher.owner_tag(settings, "rec-host"))
    env = launcher.base_env(grant, settings, run, "train")
    code = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    time.sleep(0.5)
    assert reconcile.reconcile_once(settings).killed_groups == []  # its job runs: not an orphan
    with session_scope(settings.resolved_database_url) as s:
        transition(s, job_id, S.FAILED, failure_kind="error", failure_reason="error")
    report = reconcile.reconcile_once(settings)
    assert report.killed_groups == [proc.pid]
    assert proc.wait(5) is not None and not launcher.group_alive(proc.pid)
    with session_scope(settings.resolved_database_url) as s:
        kinds = s.scalars(select(JobEvent.kind).where(JobEvent.job_id == job_id)).all()
    assert "reconcile" in kinds


def test_queued_job_whose_message_is_lost_is_sent_again_once(settings):
    url = settings.resolved_database_url
    with session_scope(url) as s:
        user = make_user(s)
        lost = make_job(s, user, age_s=120).id
        fresh = make_job(s, user, age_s=1).id
        waiting = make_job(s, user, age_s=120, dispatch_checked_at=utcnow()).id
    report = reconcile.reconcile_once(settings)
    assert report.resent == [lost]
    assert _on_broker(settings, lost) and not _on_broker(settings, fresh)
    assert not _on_broker(settings, waiting)
    with session_scope(url) as s:  # silent again, but its message is on the broker now
        s.execute(update(Job).where(Job.id == lost).values(dispatch_checked_at=utcnow() - timedelta(hours=1)))
    assert reconcile.reconcile_once(settings).resent == []


def test_the_broker_is_read_for_the_job_ids_its_messages_carry(settings):
    url = settings.resolved_database_url
    with session_scope(url) as s:
        user = make_user(s)
        sent, unsent = make_job(s, user).id, make_job(s, user).id
    reconcile.enqueue(url, sent)
    reconcile.enqueue(url, sent)  # a duplicate is one id
    ids = reconcile.broker_job_ids(settings)
    assert sent in ids and unsent not in ids
    assert sum(sent in m for m in reconcile.broker_messages(settings)) == 2
