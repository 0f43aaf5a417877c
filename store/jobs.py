"""The reads and writes of one job row that the API, the worker and the reconciler share, by name.

Status changes are not here: they go through ``store.states.transition`` (guarded, with their event).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Row, Select, Table, bindparam, func, insert, or_, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session, defer

from store.models import GpuLease, Job, JobEvent, User
from store.status import ACTIVE, JobStatus

__all__ = ["active_on_host", "active_without_live_lease", "attempt_of", "by_ids", "columns",
           "count_by_status", "count_with_status", "create", "exists", "latest_succeeded_on", "lock",
           "newest_first", "queued_of_owner", "queued_unsent_since", "set_fields", "status_of",
           "succeeded_hosts", "summaries", "using_dataset", "with_owner"]

_ACTIVE = [s.value for s in ACTIVE]


_JOBS, _JOB_EVENTS = cast(Table, Job.__table__), cast(Table, JobEvent.__table__)
# built once: executed with each job's values as parameters, its compiled form is cached
_INSERT_JOB = insert(_JOBS).returning(*_JOBS.c)
_INSERT_EVENTS = insert(_JOB_EVENTS)


def create(session: Session, values: dict[str, Any], events: list[dict[str, Any]]) -> Row[Any]:
    """Insert a new job and its first events in this transaction; returns the stored row (every
    column, defaults filled), what ``JobRead`` is built from. Two statements and no unit of work: the
    ORM's bookkeeping of objects the submission never uses again cost more than the statements."""
    conn = session.connection()
    row = conn.execute(_INSERT_JOB, values).one()
    if events:
        conn.execute(_INSERT_EVENTS, [{"job_id": row.id, **e} for e in events])
    return row


def lock(session: Session, job_id: str) -> Job | None:
    """The job row, locked for this transaction (``SELECT ... FOR UPDATE``), or None."""
    return session.scalars(select(Job).where(Job.id == job_id).with_for_update()).one_or_none()


def with_owner(session: Session, job_id: str) -> tuple[Job, str] | None:
    """The job and its owner's name, or None."""
    row = session.execute(select(Job, User.name).join(User, User.id == Job.owner_id)
                          .where(Job.id == job_id)).first()
    return (row[0], row[1]) if row is not None else None


def columns(session: Session, job_id: str, *cols: InstrumentedAttribute[Any]) -> Row[Any] | None:
    """Some columns of the job, without loading the row (its spec and plan are large), or None."""
    return session.execute(select(*cols).where(Job.id == job_id)).first()


def status_of(session: Session, job_id: str) -> JobStatus | None:
    status = session.scalar(select(Job.status).where(Job.id == job_id))
    return JobStatus(status) if status is not None else None


def attempt_of(session: Session, job_id: str, *, lock: bool = False) -> int | None:
    """Which run of the job is current (each start after a requeue is a new attempt); ``lock`` holds
    the row until the transaction ends, so the attempt cannot change under the caller."""
    query = select(Job.attempt).where(Job.id == job_id)
    return session.scalar(query.with_for_update() if lock else query)


def set_fields(session: Session, job_id: str, *, attempt: int | None = None, **values: Any) -> int:
    """Write columns of the job (never its status: see ``store.states.transition``); with ``attempt``,
    only while that run is still the job's current one. Returns how many rows changed (0 or 1)."""
    if "status" in values:
        raise ValueError("a job's status changes through store.states.transition")
    query = update(Job).where(Job.id == job_id)
    if attempt is not None:
        query = query.where(Job.attempt == attempt)
    result = session.execute(query.values(**values).execution_options(synchronize_session=False))
    return int(result.rowcount)  # type: ignore[attr-defined]


def exists(session: Session, job_id: str) -> bool:
    return session.scalar(select(Job.id).where(Job.id == job_id)) is not None


def by_ids(session: Session, job_ids: Iterable[str]) -> dict[str, Job]:
    """The jobs of these ids that exist, by id."""
    return {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(set(job_ids))))}


def active_without_live_lease(session: Session, now: datetime) -> list[str]:
    """Jobs that hold (or are about to hold) GPUs while no lease of theirs is live."""
    live = select(GpuLease.job_id).where(GpuLease.expires_at > now)
    return list(session.scalars(select(Job.id).where(Job.status.in_(_ACTIVE), Job.id.not_in(live))))


def active_on_host(session: Session, host: str) -> list[Row[Any]]:
    """(id, worker_pid, updated_at) of the active jobs a worker on ``host`` runs."""
    return list(session.execute(select(Job.id, Job.worker_pid, Job.updated_at).where(
        Job.status.in_(_ACTIVE), Job.worker_host == host)))


def queued_unsent_since(session: Session, cutoff: datetime) -> list[str]:
    """Queued jobs whose message was last sent (or, never checked, the job created) before ``cutoff``."""
    return list(session.scalars(select(Job.id).where(
        Job.status == JobStatus.QUEUED,
        or_(Job.dispatch_checked_at < cutoff,
            Job.dispatch_checked_at.is_(None) & (Job.created_at < cutoff)))))


def summaries(query: Select[tuple[Job]]) -> Select[tuple[Job, str]]:
    """``query``'s jobs with their owner's name, without the large columns a summary does not show."""
    return (query.add_columns(User.name).join(User, User.id == Job.owner_id)
            .options(defer(Job.spec), defer(Job.plan), defer(Job.eval_result), defer(Job.log_tail)))


def newest_first(session: Session, limit: int, *, after: str | None = None, statuses: Iterable[str] = (),
                 owner_id: str | None = None, owner_name: str | None = None, model: str | None = None,
                 summary: bool = True) -> list[tuple[Job, str]]:
    """A page of jobs with their owners' names, newest first (ids sort by creation time): those
    before ``after``, of ``statuses``, owned by ``owner_id`` or the user named ``owner_name``, of
    ``model``; without the large columns where ``summary``."""
    query = (summaries(select(Job)) if summary
             else select(Job, User.name).join(User, User.id == Job.owner_id))
    query = query.order_by(Job.id.desc()).limit(limit)
    wanted = [str(s) for s in statuses]
    if wanted:
        query = query.where(Job.status.in_(wanted))
    if owner_id is not None:
        query = query.where(Job.owner_id == owner_id)
    if owner_name is not None:
        query = query.where(User.name == owner_name)
    if after is not None:
        query = query.where(Job.id < after)
    if model is not None:
        query = query.where(Job.model == model)
    return list(session.execute(query).tuples())


# counted up to the limit, as a Core statement: no ORM on the submission's path
_QUEUED_OF_OWNER = select(func.count()).select_from(
    select(Job.id).where(Job.owner_id == bindparam("owner_id"), Job.status == JobStatus.QUEUED)
    .limit(bindparam("limit")).subquery())


def queued_of_owner(connection: Connection, owner_id: str, up_to: int) -> int:
    """How many queued jobs ``owner_id`` has, counted up to ``up_to``."""
    return int(connection.scalar(_QUEUED_OF_OWNER, {"owner_id": owner_id, "limit": up_to}) or 0)


def count_with_status(session: Session, status: JobStatus) -> int:
    return int(session.scalar(select(func.count()).select_from(Job).where(Job.status == status)) or 0)


def count_by_status(session: Session) -> dict[str, int]:
    return {str(status): int(n) for status, n in session.execute(
        select(Job.status, func.count()).group_by(Job.status))}


def succeeded_hosts(session: Session, host: str | None = None) -> list[str]:
    """The hosts whose workers finished a job successfully (``host`` alone, if it did)."""
    query = select(Job.worker_host).where(Job.status == JobStatus.SUCCEEDED, Job.worker_host.is_not(None))
    if host is not None:
        query = query.where(Job.worker_host == host)
    return sorted({h for h in session.scalars(query.distinct()) if h})


def latest_succeeded_on(session: Session, host: str, limit: int) -> list[Job]:
    """The ``limit`` jobs a worker on ``host`` finished successfully last, newest first."""
    return list(session.scalars(select(Job).where(Job.status == JobStatus.SUCCEEDED, Job.worker_host == host)
                                .order_by(Job.finished_at.desc()).limit(limit)))


def using_dataset(session: Session, dataset_id: str) -> tuple[str, bool] | None:
    """(the newest job that trains or evaluates on the dataset, whether it trains on it), or None."""
    row = session.execute(select(Job.id, Job.dataset_id == dataset_id)
                          .where(or_(Job.dataset_id == dataset_id, Job.eval_dataset_id == dataset_id))
                          .order_by(Job.id.desc()).limit(1)).first()
    return (row[0], bool(row[1])) if row is not None else None
