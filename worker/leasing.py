"""GPU leases in the database: which job holds which card, until when.

A job takes the number of GPUs its plan needs. A card is exclusive by default; two jobs share one
only when both plans state their peak and the peaks fit together in the card's memory less a margin.
Acquisition happens in one transaction with this host's ``gpus`` rows locked (``SELECT ... FOR
UPDATE`` on Postgres; on SQLite a first write takes the database's single writer lock), and honours
the queue: jobs go by priority, then age, and a job may not take GPUs while a job ahead of it that
could run on this host is still waiting (no backfilling past it).

A user holds at most their GPU limit at once (``users.max_gpus``, else ``max_gpus_per_user``),
counted over every host's live leases: a job whose owner is at the limit waits, and neither takes nor
holds up cards that the jobs behind it could use.

Leases carry a heartbeat; one whose holder goes silent for ``lease_ttl_s`` no longer counts and is
removed by the next acquisition or the reconciler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select, update

from store import leases
from store.base import utcnow
from store.models import Gpu, Job, User
from store.queue import queued_in_run_order

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from tunebox.settings import Settings


@dataclass(frozen=True)
class Grant:
    """The GPUs a job was given."""

    gpu_ids: tuple[int, ...]
    indices: tuple[int, ...]
    uuids: tuple[str, ...]
    exclusive: bool


@dataclass
class _Card:
    """One healthy GPU during the allocation: what is held on it so far."""

    gpu: Gpu
    exclusive_held: bool = False
    shared_bytes: list[int] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.exclusive_held and not self.shared_bytes

    def room(self, margin: float) -> int:
        return int(self.gpu.memory_total_bytes * (1 - margin)) - sum(self.shared_bytes)


def planned_gpus(job: Job) -> int:
    """How many GPUs the job's plan asks for."""
    plan = job.plan or {}
    n = plan.get("num_gpus") or (plan.get("resolved") or {}).get("num_gpus") or job.num_gpus or 1
    return max(1, int(n))


def lock_host_gpus(session: Session, host: str) -> list[Gpu]:
    """This host's GPU rows, locked against other acquisitions until the transaction ends."""
    if session.get_bind().dialect.name == "sqlite":
        # a write as the transaction's first statement takes SQLite's writer lock at once, so a
        # second acquirer waits here instead of failing later on a stale read
        session.execute(update(Gpu).where(Gpu.host == host).values(index=Gpu.index))
        return list(session.scalars(select(Gpu).where(Gpu.host == host).order_by(Gpu.index)))
    stmt = select(Gpu).where(Gpu.host == host).order_by(Gpu.index).with_for_update()
    return list(session.scalars(stmt))


def try_acquire(session: Session, job: Job, host: str, settings: Settings) -> Grant | None:
    """Lease GPUs of ``host`` to ``job`` if it is its turn and they are free; the caller commits."""
    gpus = lock_host_gpus(session, host)
    now = utcnow()
    leases.drop_expired_on(session, [g.id for g in gpus], now)
    cards = _cards(session, [g for g in gpus if g.healthy])
    queue = _queue_ahead_of(session, job)
    owners = _Owners(session, {j.owner_id for j in queue}, settings, now)
    for waiting in queue:
        if not owners.may_take(waiting):
            if waiting.id == job.id:
                return None
            continue  # its owner holds their limit: it waits without holding up the jobs behind it
        picked = _pick(cards, waiting, settings.gpu_share_margin)
        if waiting.id == job.id:
            if picked is None:
                return None
            return _grant(session, job, picked, now, settings)
        if picked is not None:
            _hold(picked, waiting)  # it will take these when its own task runs
            owners.count(waiting)
        elif _could_ever_run(cards, waiting, settings.gpu_share_margin):
            return None  # it is ahead and waiting for GPUs: do not jump it
    return None  # the job is no longer queued


class _Owners:
    """GPUs each owner holds (live leases on any host) against their limit, during one allocation."""

    def __init__(self, session: Session, owner_ids: set[str], settings: Settings, now: datetime) -> None:
        self.held: dict[str, int] = leases.held_by_owners(session, owner_ids, now)
        limits = dict(session.execute(select(User.id, User.max_gpus).where(User.id.in_(owner_ids))).all())
        self.limit = {o: limits.get(o) or settings.max_gpus_per_user for o in owner_ids}

    def may_take(self, job: Job) -> bool:
        return self.held.get(job.owner_id, 0) + planned_gpus(job) <= self.limit[job.owner_id]

    def count(self, job: Job) -> None:
        self.held[job.owner_id] = self.held.get(job.owner_id, 0) + planned_gpus(job)


def _cards(session: Session, gpus: list[Gpu]) -> list[_Card]:
    cards = {g.id: _Card(g) for g in gpus}
    for lease in leases.on_gpus(session, cards):
        card = cards[lease.gpu_id]
        if lease.exclusive:
            card.exclusive_held = True
        else:
            card.shared_bytes.append(lease.memory_bytes)
    return list(cards.values())


def _queue_ahead_of(session: Session, job: Job) -> list[Job]:
    """Queued jobs in start order up to and including ``job``."""
    out: list[Job] = []
    for queued in session.scalars(queued_in_run_order()):
        out.append(queued)
        if queued.id == job.id:
            return out
    return []


def _shareable(job: Job) -> bool:
    return job.planned_peak_gpu_bytes is not None and job.planned_peak_gpu_bytes > 0


def _fits_on(card: _Card, job: Job, margin: float) -> bool:
    if card.empty:
        return True
    if card.exclusive_held or not _shareable(job):
        return False
    return int(job.planned_peak_gpu_bytes or 0) <= card.room(margin)


def _pick(cards: list[_Card], job: Job, margin: float) -> list[_Card] | None:
    """The cards ``job`` would get now: empty ones first (no contention), then shared ones."""
    need = planned_gpus(job)
    empty = [c for c in cards if c.empty]
    shared = sorted((c for c in cards if not c.empty and _fits_on(c, job, margin)),
                    key=lambda c: -c.room(margin))
    chosen = (empty + shared)[:need]
    return chosen if len(chosen) == need else None


def _could_ever_run(cards: list[_Card], job: Job, margin: float) -> bool:
    """Whether ``job`` fits this host once it is idle; one that never can must not block the queue."""
    return _pick([_Card(c.gpu) for c in cards], job, margin) is not None


def _hold(cards: list[_Card], job: Job) -> None:
    for card in cards:
        if _shareable(job):
            card.shared_bytes.append(int(job.planned_peak_gpu_bytes or 0))
        else:
            card.exclusive_held = True


def _grant(session: Session, job: Job, cards: list[_Card], now: datetime, settings: Settings) -> Grant:
    exclusive = not _shareable(job)
    held = [(c.gpu.id, c.gpu.memory_total_bytes if exclusive else int(job.planned_peak_gpu_bytes or 0))
            for c in cards]
    leases.grant(session, job.id, held, exclusive, now, settings.lease_ttl_s)
    gpus = sorted((c.gpu for c in cards), key=lambda g: g.index)
    return Grant(gpu_ids=tuple(g.id for g in gpus), indices=tuple(g.index for g in gpus),
                 uuids=tuple(g.uuid for g in gpus), exclusive=exclusive)


def renew(session: Session, job_id: str, settings: Settings) -> int:
    """Push the job's leases' expiry forward; returns how many it still holds (0: they were lost)."""
    return leases.renew(session, job_id, utcnow(), settings.lease_ttl_s)


def release(session: Session, job_id: str) -> int:
    """Drop every lease of the job; returns how many there were."""
    return leases.release(session, job_id)


def expired_jobs(session: Session, now: datetime | None = None) -> list[str]:
    """Jobs holding only expired leases (their worker went silent)."""
    return leases.expired_jobs(session, now or utcnow())
