"""The progress recorder: the job row and its metric series at a bounded rate, on Postgres."""

from __future__ import annotations

from sqlalchemy import select

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
