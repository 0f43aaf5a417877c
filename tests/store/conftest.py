"""Store fixtures: a user to own jobs, tables emptied before each test."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from store.db import session_scope
from store.ids import new_id
from store.models import Job, User
from store.states import JobStatus
from tests.conftest import truncate_all


@pytest.fixture
def make_job(pg_url: str) -> Callable[..., str]:
    truncate_all(pg_url)
    with session_scope(pg_url) as session:
        session.add(User(id="usr_owner", name="owner"))

    def make(status: JobStatus = JobStatus.QUEUED) -> str:
        job_id = new_id("job")
        with session_scope(pg_url) as session:
            session.add(Job(id=job_id, owner_id="usr_owner", name="j", status=status, spec={}, plan={}))
        return job_id

    return make
