"""The queue's order: the order in which queued jobs start, one definition for the workers that
start them and the API that shows them."""

from __future__ import annotations

from sqlalchemy import Select, select

from store.models import Job
from store.states import JobStatus

#: higher priority first, then first come, first served (ids break a tie of equal times)
RUN_ORDER = (Job.priority.desc(), Job.created_at, Job.id)


def queued_in_run_order() -> Select[tuple[Job]]:
    return select(Job).where(Job.status == JobStatus.QUEUED).order_by(*RUN_ORDER)
