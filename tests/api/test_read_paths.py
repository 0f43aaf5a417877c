"""The two hot paths: GET /v1/jobs/{id} on the async read path (Postgres) or the threaded one
(SQLite), and POST /v1/jobs committing and enqueuing from one worker thread."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest

from store.db import session_scope
from store.models import ApiToken, Job
from tests.api.conftest import Env


def test_get_reads_the_job_as_submitted_on_either_path(env: Env) -> None:
    on_postgres = env.url.startswith("postgresql")
    assert (env.client.app.state.async_reads is not None) is on_postgres  # type: ignore[attr-defined]
    created = env.submit()
    shown = env.client.get(f"/v1/jobs/{created['id']}", headers=env.auth())
    assert shown.status_code == 200
    assert shown.json() == created  # every field, the JSON documents and timestamps included


def test_another_users_job_is_not_found_on_either_path(env: Env) -> None:
    created = env.submit()
    hidden = env.client.get(f"/v1/jobs/{created['id']}", headers=env.auth("bob"))
    assert hidden.status_code == 404
    assert hidden.json()["errors"] == [{"field": "job_id", "message": "no such job"}]
    assert env.client.get(f"/v1/jobs/{created['id']}", headers=env.auth("root")).json() == created


def test_get_unknown_job_and_bad_token_are_problems(env: Env) -> None:
    missing = env.client.get("/v1/jobs/job_nosuchjob", headers=env.auth())
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/problem+json")
    assert missing.json()["errors"] == [{"field": "job_id", "message": "no such job"}]
    bad = env.client.get("/v1/jobs/job_nosuchjob", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and "invalid_token" in bad.headers["www-authenticate"]


def test_get_marks_the_token_used(env: Env) -> None:
    env.client.get("/v1/jobs/job_nosuchjob", headers=env.auth())  # the lookup runs (cache TTL 0)
    with session_scope(env.url) as session:
        used = [t.last_used_at for t in session.query(ApiToken).all()]
    assert any(isinstance(at, datetime) for at in used)


def test_submit_commits_before_the_enqueue_and_before_the_response(env: Env) -> None:
    seen: list[str | None] = []

    def enqueue(job_id: str, *, priority: int = 0, task_id: str | None = None) -> str:
        with session_scope(env.url) as session:  # another connection: sees only committed rows
            job = session.get(Job, job_id)
            seen.append(job.celery_task_id if job is not None else None)
        return task_id or "t"

    env.client.app.state.enqueue = enqueue  # type: ignore[attr-defined]
    created = env.submit()
    with session_scope(env.url) as session:
        stored = session.get(Job, created["id"])
        assert stored is not None
        assert seen == [stored.celery_task_id]  # enqueued once, after the commit, under the stored id


def test_a_submission_takes_one_thread_hop(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """POST /v1/jobs runs its blocking work, commit and enqueue in one hand-off to the submission
    threads and none to anyio's (its dependencies run on the event loop)."""
    import anyio.to_thread

    env.submit()  # the token is looked up and cached (TTL 0: looked up each time, on the loop)
    state = env.client.app.state  # type: ignore[attr-defined]
    hops: list[str] = []
    real_run_sync, real_submit = anyio.to_thread.run_sync, state.submit_threads.submit

    async def run_sync(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(f"anyio:{getattr(fn, '__name__', fn)}")
        return await real_run_sync(fn, *args, **kwargs)

    def submit(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append("submit")
        return real_submit(fn, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", run_sync)
    monkeypatch.setattr(state.submit_threads, "submit", submit)
    created = env.submit()
    lookups = [h for h in hops if h != "submit" and "lookup" in h]  # SQLite reads the token in a thread
    assert [h for h in hops if h not in lookups] == ["submit"]
    assert env.client.get(f"/v1/jobs/{created['id']}", headers=env.auth()).json() == created


def test_a_cancelled_caller_waits_for_the_thread_before_letting_go() -> None:
    """api.deps.in_thread: a request cancelled while its work runs in a thread gets CancelledError
    only once that work has returned (its session is never closed under it)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from api.deps import in_thread

    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def work() -> str:
        started.set()
        release.wait(5)
        finished.append("work")
        return "done"

    async def main() -> None:
        with ThreadPoolExecutor(1) as executor:
            task = asyncio.ensure_future(in_thread(executor, work))
            while not started.is_set():
                await asyncio.sleep(0.001)
            task.cancel()
            await asyncio.sleep(0.05)
            assert not task.done()  # still waiting for the thread
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert finished == ["work"]
            assert await in_thread(executor, lambda: 7) == 7

    asyncio.run(main())
