"""The per-user limit on GPUs held at once, where jobs start (the API refuses at submit a job that
alone needs more; see test_hostile_input): on Postgres, through the leases the workers take."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete, update

from store.db import session_scope
from store.models import Gpu, GpuLease, Job, User
from store.states import JobStatus, transition
from tests.conftest import create_pg_database, drop_pg_database
from tests.worker.conftest import migrate
from tests.worker.factories import GIB, make_job, make_user
from tunebox import gpus
from tunebox.settings import Settings
from worker import leasing

HOST = "limit-host"


@pytest.fixture(scope="module")
def db_url() -> Iterator[str]:
    url = create_pg_database("tunebox_limits")
    migrate(url)
    yield url
    drop_pg_database(url)


@pytest.fixture
def box(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Two exclusive 24 GiB cards; each user may hold one GPU unless their row says otherwise."""
    monkeypatch.setattr(gpus, "_nvml_inventory", lambda: [])
    settings = Settings(data_dir=tmp_path, gpu_count=2, gpu_memory_bytes=24 * GIB, worker_host=HOST,
                        lease_ttl_s=60, max_gpus_per_user=1)
    with session_scope(db_url) as s:
        s.execute(delete(GpuLease))
        s.execute(delete(Gpu))
        s.execute(update(Job).where(Job.status == JobStatus.QUEUED).values(status=JobStatus.CANCELLED))
        gpus.sync_inventory(s, settings)
    return settings


def _queue(db_url: str, name: str, count: int, max_gpus: int | None = None, age_s: int = 100) -> list[str]:
    with session_scope(db_url) as s:
        owner = make_user(s, name)
        owner.max_gpus = max_gpus
        return [make_job(s, owner, peak=None, age_s=age_s - i).id for i in range(count)]


def _start(db_url: str, job_id: str, settings: Settings) -> bool:
    with session_scope(db_url) as s:
        grant = leasing.try_acquire(s, s.get(Job, job_id), HOST, settings)
        if grant is not None:
            transition(s, job_id, JobStatus.STARTING, expected=JobStatus.QUEUED)
        return grant is not None


def _finish(db_url: str, job_id: str) -> None:
    with session_scope(db_url) as s:
        leasing.release(s, job_id)
        transition(s, job_id, JobStatus.RUNNING)
        transition(s, job_id, JobStatus.SUCCEEDED)


def test_a_user_at_the_gpu_limit_waits_without_holding_up_others(db_url: str, box: Settings) -> None:
    first, second = _queue(db_url, "alice-limit", 2)
    (other,) = _queue(db_url, "bob-limit", 1, age_s=50)  # younger than both of alice's
    assert _start(db_url, first, box)
    assert not _start(db_url, second, box)  # a card is free, but alice holds her one GPU
    assert _start(db_url, other, box)  # bob's job is behind alice's waiting one and not blocked by it
    _finish(db_url, first)
    assert _start(db_url, second, box)  # alice holds nothing now


def test_a_users_own_limit_overrides_the_default(db_url: str, box: Settings) -> None:
    jobs = _queue(db_url, "carol-limit", 2, max_gpus=2)
    assert all(_start(db_url, j, box) for j in jobs)
    with session_scope(db_url) as s:
        s.execute(update(User).where(User.name == "carol-limit").values(max_gpus=None))
