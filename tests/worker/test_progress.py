"""The progress recorder: the job row and its metric series at a bounded rate, on Postgres."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from store.db import session_scope
from store.models import Job, MetricPoint
from tests.worker.factories import make_job, make_user
from worker.progress import ProgressRecorder


def _progress(step: int) -> dict:
    return {"type": "progress", "step": step, "total_steps": 12, "loss": 5.0 - step / 10, "lr": 1e-3,
            "tokens_per_second": 100.0, "time": 0.0}


def _steps(db_url: str, job_id: str) -> list[int]:
    with session_scope(db_url) as s:
        return list(s.scalars(select(MetricPoint.step).where(MetricPoint.job_id == job_id)
                              .order_by(MetricPoint.step)))


def test_a_run_read_at_once_keeps_its_first_and_last_step(db_url):
    with session_scope(db_url) as s:
        job_id = make_job(s, make_user(s)).id
    recorder = ProgressRecorder(db_url, job_id, interval_s=3600)
    # a fast run, or a busy worker: every step arrives in one read
    recorder.handle([{"type": "start", "total_steps": 12}] + [_progress(k) for k in range(1, 13)]
                    + [{"type": "done", "step": 12}])
    assert _steps(db_url, job_id) == [1, 12]
    with session_scope(db_url) as s:
        assert s.get(Job, job_id).step == 12


def test_later_steps_wait_for_the_interval(db_url):
    with session_scope(db_url) as s:
        job_id = make_job(s, make_user(s)).id
    recorder = ProgressRecorder(db_url, job_id, interval_s=3600)
    recorder.handle([_progress(1)])
    recorder.handle([_progress(2), _progress(3)])
    assert _steps(db_url, job_id) == [1]  # within the interval: held back
    recorder.flush(force=True)
    assert _steps(db_url, job_id) == [1, 3]


def test_a_first_step_lost_to_a_database_error_is_written_on_the_next_read(db_url, monkeypatch):
    import worker.progress as progress

    with session_scope(db_url) as s:
        job_id = make_job(s, make_user(s)).id
    recorder = ProgressRecorder(db_url, job_id, interval_s=3600)
    real = progress.session_scope

    def down(url):
        raise OperationalError("UPDATE jobs", {}, Exception("connection refused"))

    monkeypatch.setattr(progress, "session_scope", down)
    with pytest.raises(OperationalError):
        recorder.handle([_progress(1), _progress(2)])
    monkeypatch.setattr(progress, "session_scope", real)
    recorder.handle([_progress(3)])  # the database is back
    assert _steps(db_url, job_id) == [1]
    recorder.flush(force=True)
    assert _steps(db_url, job_id) == [1, 3]


def test_an_op_build_is_an_event_naming_the_op_and_whose_build_it_is(db_url):
    from store.models import JobEvent

    with session_scope(db_url) as s:
        job_id = make_job(s, make_user(s)).id
    ProgressRecorder(db_url, job_id, interval_s=3600).handle([
        {"type": "op_build", "op": "cpu_adam", "waiting": True},
        {"type": "op_build", "op": "fused_adam", "waiting": False}])
    with session_scope(db_url) as s:
        events = s.scalars(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "op_build")
                           .order_by(JobEvent.id)).all()
        assert [(e.data["op"], e.data["waiting"]) for e in events] == [("cpu_adam", True),
                                                                         ("fused_adam", False)]
        assert "waiting for DeepSpeed's cpu_adam op" in events[0].message
        assert events[1].message.startswith("building DeepSpeed's fused_adam op")


def test_every_checkpoints_step_is_written_whatever_the_interval(db_url):
    with session_scope(db_url) as s:
        job_id = make_job(s, make_user(s)).id
    recorder = ProgressRecorder(db_url, job_id, interval_s=3600)
    records: list[dict] = [{"type": "start", "total_steps": 12}]
    for k in range(1, 13):
        records.append(_progress(k))
        if k % 4 == 0:
            records.append({"type": "checkpoint", "step": k, "path": f"/nowhere/step-{k}"})
    recorder.handle(records + [{"type": "done", "step": 12}])
    assert _steps(db_url, job_id) == [1, 4, 8, 12]  # the first, each checkpoint's, the last


def test_the_start_hook_runs_before_any_step_is_stored_and_a_failed_one_loses_nothing(db_url):
    with session_scope(db_url) as s:
        job_id = make_job(s, make_user(s)).id
    seen: list[list[int]] = []
    fail = [True]

    def on_start(record: dict) -> None:
        seen.append(_steps(db_url, job_id))
        if fail.pop() if fail else False:
            raise OperationalError("UPDATE jobs", {}, Exception("connection refused"))

    recorder = ProgressRecorder(db_url, job_id, interval_s=3600, on_start=on_start)
    batch = [{"type": "start", "total_steps": 12}, _progress(1), _progress(2)]
    with pytest.raises(OperationalError):
        recorder.handle(batch)
    assert recorder.started is None and _steps(db_url, job_id) == []
    recorder.handle([_progress(3)])  # the next read: the start record is applied first, then the steps
    assert seen == [[], []]  # no step was stored when the hook ran, either time
    assert recorder.started == batch[0] and _steps(db_url, job_id) == [1]
    recorder.flush(force=True)
    assert _steps(db_url, job_id) == [1, 3]
