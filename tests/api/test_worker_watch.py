"""Whether a worker consumes the queue, as a submission asks it: the database is read only while a
worker could have gone quiet, and the answer is the same as reading it every time."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from sqlalchemy import event

from api import workers
from api.workers import WorkerWatch, no_worker
from store.base import utcnow
from store.db import engine_for, session_scope
from tests.conftest import truncate_all
from tunebox.gpus import sync_inventory
from tunebox.settings import Settings


@pytest.fixture(params=["postgres", "sqlite"])
def url(request: pytest.FixtureRequest, pg_url: str, sqlite_url: str) -> str:
    chosen = pg_url if request.param == "postgres" else sqlite_url
    truncate_all(chosen)
    return chosen


def test_a_live_worker_is_remembered_until_it_could_have_gone_quiet(url: str, tmp_path: Path) -> None:
    settings = Settings(database_url=url, data_dir=tmp_path, gpu_count=1, gpu_memory_bytes=2**34,
                        inventory_interval_s=10.0)
    statements: list[str] = []

    def record(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(engine_for(url), "before_cursor_execute", record)
    try:
        _check(url, settings, statements)
    finally:
        event.remove(engine_for(url), "before_cursor_execute", record)


def _check(url: str, settings: Settings, statements: list[str]) -> None:
    watch = WorkerWatch()
    with session_scope(url) as session:
        assert "no worker has reported yet" in (watch.no_worker(session, settings) or "")
        sync_inventory(session, settings)  # a worker's housekeeping
        session.flush()
        reported = utcnow()
        statements.clear()
        assert watch.no_worker(session, settings) is None
        assert watch.no_worker(session, settings) is None
        assert len([s for s in statements if "gpus" in s]) == 1  # the second answer needed no read
        # reports only move forward: past the silence allowed after the last one (three refreshes),
        # the watch reads again, and says since when
        with mock.patch.object(workers, "utcnow", return_value=reported + timedelta(seconds=29)):
            assert watch.no_worker(session, settings) is None
        assert len([s for s in statements if "gpus" in s]) == 1
        with mock.patch.object(workers, "utcnow", return_value=reported + timedelta(seconds=31)):
            problem = watch.no_worker(session, settings)
            assert problem == no_worker(session, settings)
        assert problem is not None and "no worker has reported since" in problem
        assert len([s for s in statements if "gpus" in s]) == 3
