"""The reads of a job's events (``job_events``) that the API's routes share, by name. Events are
written where they happen: with a status change (``store.states.transition``), by the worker's
recorders and by ``store.jobs.create``."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import JobEvent

__all__ = ["after", "excluding_kinds", "log_lines_after"]


def after(session: Session, job_id: str, after_id: int, limit: int) -> list[JobEvent]:
    """The job's events after ``after_id``, oldest first, at most ``limit``."""
    return list(session.scalars(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after_id)
                                .order_by(JobEvent.id).limit(limit)))


def excluding_kinds(session: Session, job_id: str, kinds: Iterable[str]) -> list[JobEvent]:
    """Every event of the job but those of ``kinds``, oldest first."""
    return list(session.scalars(select(JobEvent).where(JobEvent.job_id == job_id,
                                                       JobEvent.kind.not_in(list(kinds)))
                                .order_by(JobEvent.id)))


def log_lines_after(session: Session, job_id: str, after_id: int, limit: int) -> list[tuple[int, str]]:
    """(id, message) of the job's ``log`` events after ``after_id``, oldest first."""
    rows = session.execute(select(JobEvent.id, JobEvent.message)
                           .where(JobEvent.job_id == job_id, JobEvent.kind == "log", JobEvent.id > after_id)
                           .order_by(JobEvent.id).limit(limit)).all()
    return [(int(i), str(m)) for i, m in rows]
