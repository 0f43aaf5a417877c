"""GPU leases on Postgres: exclusive cards, sharing when planned peaks fit, queue order, expiry."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import delete, select, update

from store.base import utcnow
from store.db import session_scope
from store.models import Gpu, GpuLease, Job
from store.states import JobStatus, transition
from tests.worker.factories import GIB, make_job, make_user
from tunebox import gpus
from tunebox.settings import Settings
from worker import leasing

HOST = "lease-host"


@pytest.fixture
def box(db_url, tmp_path, monkeypatch):
    """A clean two-card (24 GiB each) host, no jobs queued; returns a factory for other sizes."""
    monkeypatch.setattr(gpus, "_nvml_inventory", lambda: [])

    def make(count: int = 2) -> Settings:
        settings = Settings(data_dir=tmp_path, gpu_count=count, gpu_memory_bytes=24 * GIB,
                            worker_host=HOST, lease_ttl_s=60)
        with session_scope(db_url) as s:
            s.execute(delete(GpuLease))
            s.execute(delete(Gpu))
            s.execute(update(Job).where(Job.status == JobStatus.QUEUED).values(status=JobStatus.CANCELLED))
            gpus.sync_inventory(s, settings)
        return settings

    return make


def _jobs(db_url, *specs: dict) -> list[str]:
    with session_scope(db_url) as s:
        user = make_user(s)
        return [make_job(s, user, **spec).id for spec in specs]


def _acquire(db_url, job_id: str, settings: Settings) -> leasing.Grant | None:
    """What the task does: lease and leave the queue in one transaction."""
    with session_scope(db_url) as s:
        grant = leasing.try_acquire(s, s.get(Job, job_id), HOST, settings)
        if grant is not None:
            transition(s, job_id, JobStatus.STARTING, expected=JobStatus.QUEUED)
        return grant


def _release(db_url, job_id: str) -> None:
    with session_scope(db_url) as s:
        leasing.release(s, job_id)


def test_cards_are_exclusive_without_planned_peaks(db_url, box):
    settings = box(2)
    a, b, c = _jobs(db_url, *({"peak": None, "age_s": 3 - i} for i in range(3)))
    ga, gb = _acquire(db_url, a, settings), _acquire(db_url, b, settings)
    assert ga and gb and ga.exclusive and {ga.indices, gb.indices} == {(0,), (1,)}
    assert _acquire(db_url, c, settings) is None
    _release(db_url, a)
    assert _acquire(db_url, c, settings).indices == ga.indices


def test_two_jobs_share_a_card_when_their_peaks_fit(db_url, box):
    settings = box(1)
    a, b, c = _jobs(db_url, {"peak": 10 * GIB, "age_s": 3}, {"peak": 10 * GIB, "age_s": 2},
                    {"peak": 3 * GIB, "age_s": 1})
    assert _acquire(db_url, a, settings).indices == (0,)
    grant_b = _acquire(db_url, b, settings)
    assert grant_b is not None and not grant_b.exclusive
    # 10 + 10 + 3 GiB exceeds 24 GiB less the 10 % margin
    assert _acquire(db_url, c, settings) is None
    with session_scope(db_url) as s:
        leases = s.scalars(select(GpuLease.memory_bytes)).all()
    assert sorted(leases) == [10 * GIB, 10 * GIB]


def test_no_sharing_when_peaks_do_not_fit_or_one_is_unknown(db_url, box):
    settings = box(1)
    a, b, c = _jobs(db_url, {"peak": 15 * GIB, "age_s": 3}, {"peak": 8 * GIB, "age_s": 2},
                    {"peak": None, "age_s": 1})
    assert _acquire(db_url, a, settings) is not None
    assert _acquire(db_url, b, settings) is None  # 15 + 8 > 21.6 GiB
    _release(db_url, a)
    assert _acquire(db_url, b, settings) is not None
    assert _acquire(db_url, c, settings) is None  # no stated peak: it needs the card to itself


def test_higher_priority_goes_first_and_a_younger_job_does_not_jump(db_url, box):
    settings = box(1)
    running, = _jobs(db_url, {"peak": None, "age_s": 10})
    assert _acquire(db_url, running, settings) is not None
    low_old, high_young = _jobs(db_url, {"priority": 0, "age_s": 5, "peak": None},
                                {"priority": 5, "age_s": 1, "peak": None})
    _release(db_url, running)
    assert _acquire(db_url, low_old, settings) is None  # the card is free, but high_young is ahead
    assert _acquire(db_url, high_young, settings) is not None


def test_waiting_multi_gpu_job_blocks_younger_jobs_on_its_cards(db_url, box):
    settings = box(2)
    holder, = _jobs(db_url, {"peak": None, "age_s": 10})
    assert _acquire(db_url, holder, settings).indices == (0,)
    big, never, small = _jobs(db_url, {"num_gpus": 2, "peak": None, "age_s": 5},
                              {"num_gpus": 3, "peak": None, "age_s": 4},  # cannot ever run on 2 cards
                              {"peak": None, "age_s": 1})
    assert _acquire(db_url, small, settings) is None  # card 1 is free, but big waits for both
    assert _acquire(db_url, big, settings) is None
    _release(db_url, holder)
    assert _acquire(db_url, big, settings).indices == (0, 1)
    assert _acquire(db_url, never, settings) is None


def test_unhealthy_cards_are_not_leased(db_url, box):
    settings = box(2)
    with session_scope(db_url) as s:
        s.scalars(select(Gpu).where(Gpu.index == 0)).one().healthy = False
    a, b = _jobs(db_url, {"peak": None, "age_s": 2}, {"peak": None, "age_s": 1})
    assert _acquire(db_url, a, settings).indices == (1,)
    assert _acquire(db_url, b, settings) is None


def test_expired_lease_frees_the_card_and_names_the_lost_job(db_url, box):
    settings = box(1)
    lost, waiting = _jobs(db_url, {"peak": None, "age_s": 2}, {"peak": None, "age_s": 1})
    assert _acquire(db_url, lost, settings) is not None
    assert _acquire(db_url, waiting, settings) is None
    with session_scope(db_url) as s:
        s.execute(update(GpuLease).values(expires_at=utcnow() - timedelta(seconds=1)))
        assert leasing.expired_jobs(s) == [lost]
        assert leasing.renew(s, lost, settings) == 0  # an expired lease is not revived
    assert _acquire(db_url, waiting, settings) is not None
    with session_scope(db_url) as s:
        assert s.scalars(select(GpuLease.job_id)).all() == [waiting]


def test_renew_pushes_expiry_and_release_drops_leases(db_url, box):
    settings = box(2)
    job, = _jobs(db_url, {"num_gpus": 2, "peak": None})
    assert _acquire(db_url, job, settings) is not None
    with session_scope(db_url) as s:
        s.execute(update(GpuLease).values(expires_at=utcnow() + timedelta(seconds=5)))
    with session_scope(db_url) as s:
        assert leasing.renew(s, job, settings) == 2
        assert min(s.scalars(select(GpuLease.expires_at))) > utcnow() + timedelta(seconds=50)
        assert leasing.release(s, job) == 2


def test_concurrent_acquisitions_never_overcommit_a_card(db_url, box):
    settings = box(1)
    ids = _jobs(db_url, *({"peak": 9 * GIB, "age_s": 10 - i} for i in range(4)))
    barrier = threading.Barrier(len(ids))
    results: dict[str, object] = {}

    def run(job_id: str) -> None:
        barrier.wait()
        results[job_id] = _acquire(db_url, job_id, settings)

    threads = [threading.Thread(target=run, args=(j,)) for j in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with session_scope(db_url) as s:
        held = s.scalars(select(GpuLease.memory_bytes)).all()
    assert sum(held) <= 24 * GIB * 0.9 and len(held) == 2
    assert sum(r is not None for r in results.values()) == 2
