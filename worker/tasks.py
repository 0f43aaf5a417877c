"""The task ``tunebox.run_job(job_id)`` and the worker's housekeeping thread.

The task carries only the job id. It re-reads the row in its own session and acts only on a job
that is still ``queued``: taking the GPU leases and moving the job to ``starting`` is one
transaction with a guarded transition, so a redelivered or duplicated message can never start a
second run. A job whose GPUs are busy (or whose turn has not come) waits: the task is retried after
``lease_wait_s``, which frees the worker slot for the job that is ahead.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from enum import StrEnum
from typing import Any

from celery import Task
from celery.signals import worker_ready, worker_shutdown

from store import jobs
from store.base import utcnow
from store.db import session_scope
from store.models import Job
from store.states import IllegalTransition, JobStatus, transition
from tunebox.broker import RUN_JOB_TASK, get_celery
from tunebox.gpus import box_device, host_name, sync_inventory
from tunebox.probe import probe_box
from tunebox.settings import Settings, get_settings
from worker import leasing
from worker.launcher import start_prebuild, stop_prebuild
from worker.leasing import Grant
from worker.reconcile import reconcile_once
from worker.supervise import JobRun

log = logging.getLogger(__name__)
app = get_celery()


class Skip(StrEnum):
    GONE = "gone"  # no such job, or it is not queued (already started, finished, cancelled)
    WAIT = "wait"  # its GPUs are busy or a job ahead of it waits for them


def claim(job_id: str, settings: Settings, task_id: str | None) -> tuple[Grant, int] | Skip:
    """Lease GPUs and move the job ``queued → starting`` in one transaction; else say why not."""
    host = host_name(settings)
    try:
        with session_scope(settings.resolved_database_url) as s:
            job = s.get(Job, job_id)
            if job is None or job.status is not JobStatus.QUEUED:
                state = "missing" if job is None else job.status.value
                log.info("job %s is %s: nothing to start (a duplicate or late message)", job_id, state)
                return Skip.GONE
            grant = leasing.try_acquire(s, job, host, settings)
            if grant is None:
                jobs.set_fields(s, job_id, dispatch_checked_at=utcnow())
                return Skip.WAIT
            attempt = job.attempt + 1
            transition(s, job_id, JobStatus.STARTING, expected=JobStatus.QUEUED, actor=f"worker:{host}",
                       message=f"starting on {host}, GPUs {list(grant.indices)} (run {attempt})",
                       data={"host": host, "gpus": list(grant.indices), "uuids": list(grant.uuids),
                             "attempt": attempt},
                       worker_host=host, worker_pid=os.getpid(), gpu_indices=list(grant.indices),
                       celery_task_id=task_id, attempt=attempt, dispatch_checked_at=utcnow())
            return grant, attempt
    except IllegalTransition as exc:  # cancelled (or taken) between the read and the update
        log.info("job %s: %s", job_id, exc)
        return Skip.GONE


@app.task(name=RUN_JOB_TASK, bind=True, acks_late=True, max_retries=None, ignore_result=True)
def run_job(self: Task, job_id: str) -> str:
    settings = get_settings()
    claimed = claim(job_id, settings, self.request.id)
    if claimed is Skip.WAIT:
        raise self.retry(countdown=settings.lease_wait_s, max_retries=None)
    if isinstance(claimed, Skip):
        return claimed.value
    grant, attempt = claimed
    status = JobRun(job_id, attempt, grant, settings, host_name(settings)).run()
    return status.value if status is not None else "lost"


# --------------------------------------------------------------------------- housekeeping


class Housekeeping(threading.Thread):
    """Refreshes this host's GPU inventory and runs the reconciler, at start and periodically."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(name="tunebox-housekeeping", daemon=True)
        self.settings = settings
        self.stopping = threading.Event()

    def run(self) -> None:
        next_inventory = next_reconcile = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            if now >= next_inventory:
                next_inventory = now + self.settings.inventory_interval_s
                self._safely(self.sync)
            if now >= next_reconcile:
                next_reconcile = now + self.settings.reconcile_interval_s
                self._safely(self.reconcile)
            self.stopping.wait(min(next_inventory, next_reconcile) - time.monotonic())

    def sync(self) -> None:
        with session_scope(self.settings.resolved_database_url) as s:
            sync_inventory(s, self.settings)

    def reconcile(self) -> None:
        report = reconcile_once(self.settings)
        if any(vars(report).values()):
            log.warning("reconciler: %s", report)

    @staticmethod
    def _safely(step: Any) -> None:
        try:
            step()
        except Exception:  # a database blip must not stop housekeeping for good
            log.exception("housekeeping step failed")


_housekeeping: Housekeeping | None = None
#: the op prebuild this worker started (it leads its own session, so the worker's signals miss it)
_prebuilt: subprocess.Popen[bytes] | None = None


@worker_ready.connect
def _start_housekeeping(**_: Any) -> None:
    global _housekeeping
    settings = get_settings()
    keeper = Housekeeping(settings)
    keeper.sync()  # jobs can only be placed once this host's GPUs are known
    keeper.start()
    # plans use the catalogue and the settings until the probe has stored its figures
    threading.Thread(target=Housekeeping._safely, args=(lambda: probe_box(settings),),
                     name="tunebox-box-probe", daemon=True).start()
    # the first job then loads DeepSpeed's ops rather than waiting for their build
    threading.Thread(target=Housekeeping._safely, args=(lambda: _prebuild(settings),),
                     name="tunebox-op-prebuild", daemon=True).start()
    _housekeeping = keeper


def _prebuild(settings: Settings) -> None:
    global _prebuilt
    proc = _prebuilt = start_prebuild(settings, box_device(settings))
    # waited for, so the worker reaps it; one that a stopping worker ended did not fail
    if proc is not None and proc.wait() != 0 and not (_housekeeping and _housekeeping.stopping.is_set()):
        log.warning("building DeepSpeed's ops failed (exit %s): see %s", proc.returncode,
                    settings.data_dir / "prebuild.log")


@worker_shutdown.connect
def _stop_housekeeping(**_: Any) -> None:
    if _housekeeping is not None:
        _housekeeping.stopping.set()
    if _prebuilt is not None:  # a worker that stops takes its build with it
        stop_prebuild(_prebuilt, get_settings())
