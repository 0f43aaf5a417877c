"""The job state machine: the one place job status changes.

Every transition is a compare-and-set ``UPDATE ... WHERE id = :id AND status IN (:allowed)``, so two
writers racing (a cancel and a worker's start, two deliveries of one task) cannot both win.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sqlalchemy import update

from store.base import utcnow
from store.models import Job, JobEvent
from store.status import ACTIVE, TERMINAL, JobStatus

__all__ = ["ACTIVE", "ALLOWED_FROM", "TERMINAL", "FailureKind", "IllegalTransition", "JobStatus",
           "can_transition", "transition"]

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


S = JobStatus
# target state -> the states it may be entered from
ALLOWED_FROM: Mapping[JobStatus, frozenset[JobStatus]] = {
    # re-queued after a lost worker; resumed from paused
    S.QUEUED: frozenset({S.STARTING, S.RUNNING, S.EVALUATING, S.PAUSED}),
    S.STARTING: frozenset({S.QUEUED}),
    S.RUNNING: frozenset({S.STARTING}),
    S.EVALUATING: frozenset({S.RUNNING}),
    S.CANCELLING: frozenset({S.STARTING, S.RUNNING, S.EVALUATING, S.PAUSING}),
    S.PAUSING: frozenset({S.RUNNING}),
    # the training saved a checkpoint at a step boundary and ended; its GPUs are free
    S.PAUSED: frozenset({S.PAUSING}),
    S.SUCCEEDED: frozenset({S.RUNNING, S.EVALUATING}),
    S.FAILED: frozenset({S.QUEUED, S.STARTING, S.RUNNING, S.EVALUATING, S.CANCELLING, S.PAUSING}),
    S.CANCELLED: frozenset({S.QUEUED, S.CANCELLING, S.PAUSED}),
}


class FailureKind(StrEnum):
    USER_ERROR = "user_error"
    ERROR = "error"


class IllegalTransition(Exception):
    """The job was not in a state from which ``target`` may be entered."""

    def __init__(self, job_id: str, target: JobStatus, current: JobStatus | None) -> None:
        self.job_id, self.target, self.current = job_id, target, current
        where = "does not exist" if current is None else f"is {current.value}"
        super().__init__(f"job {job_id} {where}; cannot become {target.value}")


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return current in ALLOWED_FROM[target]


def transition(
    session: Session,
    job_id: str,
    target: JobStatus,
    *,
    expected: JobStatus | frozenset[JobStatus] | None = None,
    actor: str | None = None,
    message: str = "",
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> JobStatus:
    """Move ``job_id`` to ``target`` if allowed (and, if given, only from ``expected``).

    Sets the timestamps that belong to the target, writes ``fields`` in the same UPDATE, appends a
    ``status`` event, and returns the previous status. Raises :class:`IllegalTransition` otherwise.
    The caller's transaction commits.
    """
    allowed = ALLOWED_FROM[target]
    if expected is not None:
        allowed = allowed & (frozenset({expected}) if isinstance(expected, JobStatus) else expected)
    previous = session.query(Job.status).filter(Job.id == job_id).scalar()
    now = utcnow()
    values: dict[str, Any] = {"status": target, "updated_at": now, **fields}
    if target is S.RUNNING:
        values.setdefault("started_at", now)
    if target.terminal():
        values.setdefault("finished_at", now)
    if target is S.QUEUED:
        values.update(worker_host=None, worker_pid=None, process_group=None, gpu_indices=None)
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_([s.value for s in allowed]))
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        current = session.query(Job.status).filter(Job.id == job_id).scalar()
        raise IllegalTransition(job_id, target, JobStatus(current) if current else None)
    prev = JobStatus(previous) if previous is not None else target
    event_data = {"from": prev.value, "to": target.value, **(data or {})}
    session.add(JobEvent(job_id=job_id, kind="status", actor=actor,
                         message=message or f"{prev.value} → {target.value}", data=event_data))
    session.flush()
    # the ORM copy in this session (if loaded) must not serve the old status
    job = session.get(Job, job_id)
    if job is not None:
        session.refresh(job)
    return prev
