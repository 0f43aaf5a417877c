"""The reconciler: makes the database, the processes and the broker agree again after a failure.

Run by every worker at start-up and then periodically. Each pass:

1. **Lost jobs.** A job in ``starting``/``running``/``evaluating``/``cancelling`` whose GPU leases
   expired (or are gone), or whose worker on this host no longer exists, lost its worker. It is
   queued again (``attempt`` counts runs; the training resumes from its last checkpoint) while runs
   remain, else ``failed``/``worker_lost``; a job being cancelled becomes ``cancelled``; a job lost
   during evaluation keeps its trained model and succeeds with the evaluation marked failed.
2. **Orphaned processes.** A process group this host's workers started (found by its environment
   markers) whose job is finished, re-queued, moved to another run, or whose worker is gone, is killed.
3. **Lost messages.** A job ``queued`` longer than ``requeue_after_s`` that no worker has looked at
   and whose message is not on the broker is sent again. A duplicate is harmless: the task starts
   only a job that is still queued, through a guarded transition.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from store import jobs, leases
from store.base import utcnow
from store.db import session_scope
from store.ids import id_pattern
from store.models import Job, JobEvent
from store.states import ACTIVE, TERMINAL, JobStatus, transition
from tunebox.gpus import host_name
from worker import launcher, leasing

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from tunebox.settings import Settings

log = logging.getLogger(__name__)
ACTOR = "reconciler"
_JOB_ID = id_pattern("job")


@dataclass
class Report:
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    succeeded: list[str] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)
    killed_groups: list[int] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)


def reconcile_once(settings: Settings) -> Report:
    report = Report()
    host = host_name(settings)
    url = settings.resolved_database_url
    for job_id in _lost_job_ids(url, host):
        _recover(url, job_id, host, settings, report)
    _drop_dead_leases(url)
    _kill_orphans(url, host, settings, report)
    _resend_lost_messages(url, settings, report)
    for job_id in report.requeued:
        enqueue(url, job_id)
    return report


# --------------------------------------------------------------------------- lost jobs


def _lost_job_ids(url: str, host: str) -> list[str]:
    with session_scope(url) as s:
        no_live_lease = jobs.active_without_live_lease(s, utcnow())
        here = jobs.active_on_host(s, host)
    dead_here = [job_id for job_id, pid, updated in here if not worker_alive(pid, updated)]
    return sorted(set(no_live_lease) | set(dead_here))


def worker_alive(pid: int | None, claimed_before: datetime | None) -> bool:
    """Whether the worker process that ran a job on this host still exists (not a reused pid)."""
    if not pid:
        return False
    import psutil

    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        return False
    if pid == os.getpid():
        return True
    return claimed_before is None or created <= claimed_before.timestamp() + 1


def _recover(url: str, job_id: str, host: str, settings: Settings, report: Report) -> None:
    with session_scope(url) as s:
        job = jobs.lock(s, job_id)
        if job is None or job.status not in ACTIVE or not _still_lost(s, job, host):
            return
        outcome = recover_lost(s, job, settings, "the worker running this job stopped responding")
    getattr(report, outcome).append(job_id)
    log.warning("job %s lost its worker: %s", job_id, outcome)


def _still_lost(session: Session, job: Job, host: str) -> bool:
    if not leases.live_count(session, job.id, utcnow()):
        return True
    return job.worker_host == host and not worker_alive(job.worker_pid, job.updated_at)


def recover_lost(session: Session, job: Job, settings: Settings, message: str) -> str:
    """End or re-queue a job whose run is gone; returns the ``Report`` list it belongs in."""
    leasing.release(session, job.id)
    status, data = JobStatus(job.status), {"attempt": job.attempt}
    if status is JobStatus.CANCELLING:
        transition(session, job.id, JobStatus.CANCELLED, expected=status, actor=ACTOR,
                   message=f"cancelled: {message}", data=data)
        return "cancelled"
    if status is JobStatus.PAUSING:
        # resuming continues from the newest complete checkpoint, whichever run wrote it
        transition(session, job.id, JobStatus.PAUSED, expected=status, actor=ACTOR,
                   message=f"paused: {message}", data=data)
        return "paused"
    if status is JobStatus.EVALUATING:
        # the trained model is complete; only its evaluation was lost
        transition(session, job.id, JobStatus.SUCCEEDED, expected=status, actor=ACTOR,
                   message=f"succeeded; evaluation lost: {message}", data=data, eval_status="failed",
                   eval_result={"status": "failed", "reason": "worker_lost", "message": message})
        return "succeeded"
    if job.attempt < settings.max_attempts:
        transition(session, job.id, JobStatus.QUEUED, expected=status, actor=ACTOR,
                   message=f"queued again (run {job.attempt} of {settings.max_attempts} lost): {message}",
                   data=data, dispatch_checked_at=utcnow())
        return "requeued"
    transition(session, job.id, JobStatus.FAILED, expected=status, actor=ACTOR, data=data,
               message=f"failed: {message}; no runs left", failure_kind="error",
               failure_reason="worker_lost",
               failure_message=f"{message} ({job.attempt} of {settings.max_attempts} runs used)")
    return "failed"


def _drop_dead_leases(url: str) -> None:
    """Leases of jobs that no longer run (a worker died between its last write and the release)."""
    with session_scope(url) as s:
        without_process = TERMINAL | {JobStatus.QUEUED, JobStatus.PAUSED}
        leases.drop_of_jobs_in(s, without_process)


# --------------------------------------------------------------------------- orphaned processes


@dataclass(frozen=True)
class OwnedGroup:
    pgid: int
    job_id: str
    attempt: int | None
    role: str


def owned_groups(owner: str) -> list[OwnedGroup]:
    """Process groups on this machine that carry ``owner``'s marker, one entry per group."""
    import psutil

    groups: dict[int, OwnedGroup] = {}
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            env = proc.environ()
            if env.get(launcher.ENV_OWNER) != owner:
                continue
            pgid = os.getpgid(proc.pid)
            attempt = env.get(launcher.ENV_ATTEMPT)
            groups.setdefault(pgid, OwnedGroup(pgid, env.get(launcher.ENV_JOB_ID, ""),
                                               int(attempt) if attempt else None,
                                               env.get(launcher.ENV_ROLE, "")))
    return list(groups.values())


def _kill_orphans(url: str, host: str, settings: Settings, report: Report) -> None:
    owner = launcher.owner_tag(settings, host)
    groups = [g for g in owned_groups(owner) if g.pgid != os.getpgid(0)]
    if not groups:
        return
    with session_scope(url) as s:
        rows = jobs.by_ids(s, (g.job_id for g in groups))
        orphans = [g for g in groups if _is_orphan(g, rows.get(g.job_id), host)]
    for group in orphans:
        log.warning("killing orphaned process group %s of job %s", group.pgid, group.job_id)
        launcher.terminate_pgid(group.pgid, settings.cancel_grace_s)
        report.killed_groups.append(group.pgid)
        _event(url, group.job_id, f"killed leftover {group.role} processes (group {group.pgid})")


def _is_orphan(group: OwnedGroup, job: Job | None, host: str) -> bool:
    if job is None or job.status not in ACTIVE:
        return True
    if job.worker_host != host or (group.attempt is not None and group.attempt != job.attempt):
        return True
    return not worker_alive(job.worker_pid, job.updated_at)


def _event(url: str, job_id: str, message: str) -> None:
    with session_scope(url) as s:
        if jobs.exists(s, job_id):
            s.add(JobEvent(job_id=job_id, kind="reconcile", actor=ACTOR, message=message))


# --------------------------------------------------------------------------- lost messages


def _resend_lost_messages(url: str, settings: Settings, report: Report) -> None:
    cutoff = utcnow() - timedelta(seconds=settings.requeue_after_s)
    with session_scope(url) as s:
        stale = jobs.queued_unsent_since(s, cutoff)
    if not stale:
        return
    on_broker = broker_job_ids(settings)
    missing = [j for j in stale if j not in report.requeued and j not in on_broker]
    if not missing:
        return
    with session_scope(url) as s:
        for job_id in missing:
            jobs.set_fields(s, job_id, dispatch_checked_at=utcnow())
            s.add(JobEvent(job_id=job_id, kind="reconcile", actor=ACTOR,
                           message="the job's message was not on the broker; sent again"))
    for job_id in missing:
        enqueue(url, job_id)
    report.resent.extend(missing)


def broker_job_ids(settings: Settings) -> set[str]:
    """The job ids the messages on the broker's ``gpu`` queue carry: read once per pass, so a long
    queue costs its length, not its length times the number of jobs waiting in it."""
    return {job_id for message in broker_messages(settings) for job_id in _JOB_ID.findall(message)}


def broker_messages(settings: Settings) -> list[str]:
    """The raw messages waiting on (or held unacknowledged from) the broker's ``gpu`` queue."""
    url = settings.resolved_broker_url
    try:
        if url.startswith(("redis://", "rediss://")):
            return list(_redis_messages(url))
        if url.startswith("filesystem"):
            return list(_folder_messages(settings))
    except Exception:  # an unreachable broker: say nothing is there, a duplicate is harmless
        log.exception("could not read the broker's queue")
    return []


def _redis_messages(url: str) -> Iterable[str]:
    import redis

    from tunebox.broker import GPU_QUEUE

    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"{GPU_QUEUE}*"):
            if client.type(key) == b"list":
                yield from map(_text, client.lrange(key, 0, -1))
        yield from map(_text, client.hvals("unacked"))
    finally:
        client.close()


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def _folder_messages(settings: Settings) -> Iterable[str]:
    from tunebox.broker import broker_folders

    folder = broker_folders(settings)["data_folder_in"]
    for path in folder.glob("*.msg"):
        with contextlib.suppress(OSError):
            yield path.read_text("utf-8", "replace")


def enqueue(url: str, job_id: str) -> None:
    """Send the run task; only after the commit that left the job queued."""
    from tunebox.broker import enqueue_job

    with session_scope(url) as s:
        row = jobs.columns(s, job_id, Job.priority)
        priority = (row.priority if row is not None else 0) or 0
    enqueue_job(job_id, priority=priority)
