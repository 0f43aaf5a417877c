"""A job's per-step metric points (``metric_points``): the worker's upsert and the API's reads."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import MetricPoint

__all__ = ["at_step", "points"]


def points(session: Session, job_id: str, kind: str | None = None, *, after_step: int | None = None,
           limit: int | None = None) -> list[MetricPoint]:
    """The job's points (of ``kind``, after ``after_step``), by step."""
    query = (select(MetricPoint).where(MetricPoint.job_id == job_id)
             .order_by(MetricPoint.step, MetricPoint.kind))
    if kind is not None:
        query = query.where(MetricPoint.kind == kind)
    if after_step is not None:
        query = query.where(MetricPoint.step > after_step)
    if limit is not None:
        query = query.limit(limit)
    return list(session.scalars(query))


def at_step(session: Session, job_id: str, kind: str, step: int) -> MetricPoint | None:
    return session.scalars(select(MetricPoint).where(MetricPoint.job_id == job_id, MetricPoint.kind == kind,
                                                     MetricPoint.step == step)).one_or_none()
