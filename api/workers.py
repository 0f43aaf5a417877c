"""Whether a worker is consuming the queue: every worker refreshes its box's GPU rows each
``inventory_interval_s`` (its housekeeping thread), so the newest refresh is the last sign of life."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from store.base import utcnow
from store.models import Gpu
from tunebox.settings import Settings

#: refreshes a worker may miss before it counts as gone (a busy box, a slow database)
MISSED_REFRESHES = 3


def no_worker(session: Session, settings: Settings) -> str | None:
    """Why no worker is consuming the queue, or None while one reported recently."""
    return WorkerWatch().no_worker(session, settings)


class WorkerWatch:
    """``no_worker`` that reads the database only when a worker could have gone quiet: a report at
    T means a worker counts as alive until T plus the silence allowed, so until then the answer is
    known. One per app (a submission asks on every request)."""

    def __init__(self) -> None:
        self._alive_until: datetime | None = None

    def no_worker(self, session: Session, settings: Settings) -> str | None:
        now = utcnow()
        if self._alive_until is not None and now <= self._alive_until:
            return None
        last = session.scalar(select(func.max(Gpu.updated_at)))
        silence = timedelta(seconds=MISSED_REFRESHES * settings.inventory_interval_s)
        if last is not None and now - last <= silence:
            self._alive_until = last + silence
            return None
        self._alive_until = None
        since = ("no worker has reported yet" if last is None
                 else f"no worker has reported since {last:%Y-%m-%d %H:%M:%S} UTC")
        return (f"{since} (each refreshes its GPUs every {settings.inventory_interval_s:g} s): jobs wait in "
                "the queue until `tunebox worker` runs on a GPU box (`tunebox serve` runs one itself on the "
                "embedded default)")
