"""The job row's shared reads and writes (store/jobs.py) on Postgres."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, cast

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


def test_create_returns_the_row_as_stored_and_leaves_unset_json_null(
        pg_url: str, make_job: Callable[..., str]) -> None:
    """``jobs.create`` answers without reading the row back: its dict must be every column as
    stored (defaults filled), the JSON text stored as a document, and the JSON columns it was not
    given SQL NULL (not a JSON null); its events are stored in order in one statement."""
    from sqlalchemy import Table, select

    from store.models import JobEvent

    make_job()  # the owner
    spec = {"name": "naïve", "lr": 1.25e-05, "nested": {"a": [1, None, "é"]}}
    events: list[dict[str, Any]] = [
        {"kind": "created", "actor": "owner", "message": "job created", "data": {"status": "queued"}},
        {"kind": "audit", "actor": "owner", "message": "create", "data": {"action": "create"}},
        {"kind": "waiting", "actor": "api", "message": "no worker", "data": None}]
    with session_scope(pg_url) as s:
        stored = jobs.create(s, {"id": "job_created1", "owner_id": "usr_owner", "name": "n", "priority": 5,
                                 "spec": json.dumps(spec), "plan": json.dumps({"fits": True})}, events)
    table = cast(Table, Job.__table__)
    with session_scope(pg_url) as s:
        row = s.execute(select(*table.c).where(Job.id == "job_created1")).one()._asdict()
        unset = select(Job.id).where(Job.id == "job_created1", Job.eval_result.is_(None),
                                     Job.data_report.is_(None), Job.gpu_indices.is_(None))
        assert s.scalar(unset) == "job_created1"
        stored_events = s.execute(select(JobEvent.kind, JobEvent.actor, JobEvent.message, JobEvent.data)
                                  .where(JobEvent.job_id == "job_created1").order_by(JobEvent.id)).all()
    assert row["spec"] == spec and row["plan"] == {"fits": True}
    assert {**stored, "spec": json.loads(stored["spec"]), "plan": json.loads(stored["plan"])} == row
    assert stored["status"] is JobStatus.QUEUED and stored["attempt"] == 0 and stored["created_at"]
    expected = [(e["kind"], e["actor"], e["message"], e["data"]) for e in events]
    assert [tuple(e) for e in stored_events] == expected


def test_create_without_events_stores_the_json_documents(pg_url: str, make_job: Callable[..., str]) -> None:
    make_job()  # the owner
    with session_scope(pg_url) as s:
        jobs.create(s, {"id": "job_created2", "owner_id": "usr_owner", "name": "n",
                        "spec": json.dumps({"a": [1, 2]}), "plan": json.dumps({"fits": False})}, [])
    with session_scope(pg_url) as s:
        job = s.get(Job, "job_created2")
        assert job is not None and job.spec == {"a": [1, 2]} and job.plan == {"fits": False}
        assert job.status is JobStatus.QUEUED and job.priority == 0
