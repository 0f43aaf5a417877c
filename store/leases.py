"""GPU leases (``gpu_leases``): who holds which card until when. The worker's allocation decides which
cards a job gets (``worker/leasing.py``); every read and write of the rows is here, by name."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from store.models import GpuLease, Job
from store.status import JobStatus

__all__ = ["drop_expired_on", "drop_of_jobs_in", "expired_jobs", "grant", "held_by_owners", "live_count",
           "live_by_gpu", "on_gpus", "release", "renew"]


def held_by_owners(session: Session, owner_ids: Iterable[str], now: datetime) -> dict[str, int]:
    """Live leases (cards) each of these owners' jobs hold, on any host."""
    return {str(owner): int(n) for owner, n in session.execute(
        select(Job.owner_id, func.count(GpuLease.id)).join(Job, Job.id == GpuLease.job_id)
        .where(Job.owner_id.in_(list(owner_ids)), GpuLease.expires_at > now).group_by(Job.owner_id))}


def on_gpus(session: Session, gpu_ids: Iterable[int]) -> list[GpuLease]:
    """Every lease of these cards, live or not."""
    return list(session.scalars(select(GpuLease).where(GpuLease.gpu_id.in_(list(gpu_ids)))))


def live_by_gpu(session: Session, now: datetime) -> dict[int, list[GpuLease]]:
    """The live leases of every card, oldest first."""
    out: dict[int, list[GpuLease]] = {}
    for lease in session.scalars(select(GpuLease).where(GpuLease.expires_at > now).order_by(GpuLease.id)):
        out.setdefault(lease.gpu_id, []).append(lease)
    return out


def live_count(session: Session, job_id: str, now: datetime) -> int:
    return int(session.scalar(select(func.count()).select_from(GpuLease).where(
        GpuLease.job_id == job_id, GpuLease.expires_at > now)) or 0)


def drop_expired_on(session: Session, gpu_ids: list[int], now: datetime) -> None:
    if gpu_ids:
        session.execute(delete(GpuLease).where(GpuLease.gpu_id.in_(gpu_ids), GpuLease.expires_at <= now))


def grant(session: Session, job_id: str, cards: Iterable[tuple[int, int]], exclusive: bool, now: datetime,
          ttl_s: float) -> None:
    """The job's leases on ``cards`` ((gpu id, bytes held) each), replacing any earlier attempt's."""
    session.execute(delete(GpuLease).where(GpuLease.job_id == job_id))
    expires = now + timedelta(seconds=ttl_s)
    for gpu_id, memory in cards:
        session.add(GpuLease(gpu_id=gpu_id, job_id=job_id, exclusive=exclusive, memory_bytes=memory,
                             created_at=now, heartbeat_at=now, expires_at=expires))
    session.flush()


def renew(session: Session, job_id: str, now: datetime, ttl_s: float) -> int:
    """Push the job's live leases' expiry forward; returns how many it still holds (0: they were lost)."""
    result = session.execute(
        update(GpuLease).where(GpuLease.job_id == job_id, GpuLease.expires_at > now)
        .values(heartbeat_at=now, expires_at=now + timedelta(seconds=ttl_s))
        .execution_options(synchronize_session=False))
    return int(result.rowcount)  # type: ignore[attr-defined]


def release(session: Session, job_id: str) -> int:
    """Drop every lease of the job; returns how many there were."""
    result = session.execute(delete(GpuLease).where(GpuLease.job_id == job_id)
                             .execution_options(synchronize_session=False))
    return int(result.rowcount)  # type: ignore[attr-defined]


def drop_of_jobs_in(session: Session, statuses: Iterable[JobStatus]) -> None:
    """Leases of the jobs in ``statuses`` (ones that run no process)."""
    idle = select(Job.id).where(Job.status.in_([s.value for s in statuses]))
    session.execute(delete(GpuLease).where(GpuLease.job_id.in_(idle)).execution_options(
        synchronize_session=False))


def expired_jobs(session: Session, now: datetime) -> list[str]:
    """Jobs holding only expired leases (their worker went silent)."""
    expired = set(session.scalars(select(GpuLease.job_id).where(GpuLease.expires_at <= now)))
    live = set(session.scalars(select(GpuLease.job_id).where(GpuLease.expires_at > now)))
    return sorted(expired - live)
