"""The job row's shared reads and writes (store/jobs.py) on Postgres."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from store import jobs
from store.db import session_scope
from store.models import Job
from store.states import JobStatus, transition


def test_set_fields_writes_only_while_the_run_is_current(pg_url: str, make_job: Callable[..., str]) -> None:
    job_id = make_job()
    with session_scope(pg_url) as s:
        current = jobs.attempt_of(s, job_id)
        assert jobs.set_fields(s, job_id, attempt=current, log_tail="first") == 1
        assert jobs.set_fields(s, job_id, attempt=(current or 0) + 1, log_tail="a later run's") == 0
    with session_scope(pg_url) as s:
        row = jobs.columns(s, job_id, Job.log_tail, Job.status)
        assert row is not None and row.log_tail == "first" and JobStatus(row.status) is JobStatus.QUEUED
        assert jobs.status_of(s, job_id) is JobStatus.QUEUED
        assert jobs.columns(s, "job_none", Job.log_tail) is None and jobs.status_of(s, "job_none") is None


def test_a_status_is_never_written_beside_its_transition(pg_url: str, make_job: Callable[..., str]) -> None:
    job_id = make_job()
    with session_scope(pg_url) as s, pytest.raises(ValueError, match="transition"):
        jobs.set_fields(s, job_id, status=JobStatus.RUNNING)


def test_lock_holds_the_row_until_the_transaction_ends(pg_url: str, make_job: Callable[..., str]) -> None:
    """A second transaction's transition waits for the lock; it sees the row as the first left it."""
    job_id = make_job()
    locked, done = threading.Event(), threading.Event()

    def other() -> None:
        locked.wait(5)
        with session_scope(pg_url) as s:
            transition(s, job_id, JobStatus.STARTING, actor="test")
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with session_scope(pg_url) as s:
        job = jobs.lock(s, job_id)
        assert job is not None and job.status is JobStatus.QUEUED
        locked.set()
        assert not done.wait(0.5)  # blocked on the row lock
        jobs.set_fields(s, job_id, log_tail="while locked")
    thread.join(5)
    assert done.is_set()
    with session_scope(pg_url) as s:
        found = jobs.with_owner(s, job_id)
        assert found is not None and found[1] == "owner"
        assert found[0].status is JobStatus.STARTING and found[0].log_tail == "while locked"
