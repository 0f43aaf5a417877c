"""Events as JSON pages and as an SSE stream (resume with Last-Event-ID, end at a terminal state);
metrics series and checkpoints."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.app import create_app
from api.jobs.stream import StreamTiming
from store.db import session_scope
from store.ids import new_id
from store.models import Checkpoint, JobEvent, MetricPoint
from store.states import JobStatus, transition
from tests.api.conftest import Env, serve_in_thread

S = JobStatus


def _log(env: Env, job_id: str, *messages: str) -> None:
    with session_scope(env.url) as session:
        session.add_all([JobEvent(job_id=job_id, kind="log", message=m) for m in messages])


def _move(env: Env, job_id: str, *targets: JobStatus) -> None:
    with session_scope(env.url) as session:
        for target in targets:
            transition(session, job_id, target, actor="worker")


def parse_sse(text: str) -> list[dict[str, str]]:
    """SSE frames as dicts; comment lines come back as {"comment": ...}."""
    frames = []
    for block in text.split("\n\n"):
        frame: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":"):
                frame["comment"] = line[1:].strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                frame[key] = value.lstrip()
        if frame:
            frames.append(frame)
    return frames


def test_events_json_pages_with_after(env: Env) -> None:
    job = env.submit()
    _log(env, job["id"], "a", "b", "c")
    url = f"/v1/jobs/{job['id']}/events"
    first = env.client.get(url, params={"limit": 2}, headers=env.auth()).json()
    rest = env.client.get(url, params={"after": first["next_after"]}, headers=env.auth()).json()
    kinds = [e["kind"] for e in first["items"] + rest["items"]]
    assert kinds == ["created", "audit", "log", "log", "log"]
    ids = [e["id"] for e in first["items"] + rest["items"]]
    assert ids == sorted(ids) and len(set(ids)) == 5


def test_sse_sends_backlog_and_ends_when_terminal(env: Env) -> None:
    job = env.submit()
    _log(env, job["id"], "hello")
    env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.auth())
    res = env.client.get(f"/v1/jobs/{job['id']}/events",
                         headers={**env.auth(), "Accept": "text/event-stream"})
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in parse_sse(res.text) if "event" in f]
    assert [f["event"] for f in frames] == ["created", "audit", "log", "status", "audit", "end"]
    assert all(f["id"].isdigit() for f in frames[:-1])
    assert '"cancelled"' in frames[-1]["data"]


def test_sse_resumes_after_last_event_id(env: Env) -> None:
    job = env.submit()
    _log(env, job["id"], "one", "two")
    env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.auth())
    url = f"/v1/jobs/{job['id']}/events"
    sse = {**env.auth(), "Accept": "text/event-stream"}
    all_ids = [f["id"] for f in parse_sse(env.client.get(url, headers=sse).text) if "id" in f]
    resumed = parse_sse(env.client.get(url, headers={**sse, "Last-Event-ID": all_ids[2]}).text)
    assert [f["id"] for f in resumed if "id" in f] == all_ids[3:]
    bad = env.client.get(url, headers={**sse, "Last-Event-ID": "abc"})
    assert bad.status_code == 422


def test_sse_follows_a_live_job_with_keepalives(pg_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from api.jobs import stream

    app = create_app(pg_env.settings, enqueue=pg_env.enqueued, token_cache_ttl_s=0,
                     stream_timing=StreamTiming(poll_s=0.02, keepalive_s=0.05))
    job = pg_env.submit()
    _move(pg_env, job["id"], S.STARTING, S.RUNNING)
    # The job moves on only after the stream has polled ten times with nothing new: nine sleeps
    # of poll_s outlast keepalive_s, so a keepalive went out however slowly the stream started.
    polls = threading.Semaphore(0)
    poll = stream._poll

    def counted(*args: Any) -> Any:
        polls.release()
        return poll(*args)

    monkeypatch.setattr(stream, "_poll", counted)

    def quiet_polls(n: int = 10) -> None:
        for _ in range(n):
            assert polls.acquire(timeout=60)

    def worker() -> None:
        quiet_polls()
        _log(pg_env, job["id"], "step 1")
        quiet_polls()
        _move(pg_env, job["id"], S.SUCCEEDED)

    thread = threading.Thread(target=worker)
    thread.start()
    with TestClient(app) as client:
        res = client.get(f"/v1/jobs/{job['id']}/events",
                         headers={**pg_env.auth(), "Accept": "text/event-stream"})
    thread.join()
    frames = parse_sse(res.text)
    assert any(f.get("comment") == "keepalive" for f in frames)
    events = [f["event"] for f in frames if "event" in f]
    assert events[-3:] == ["log", "status", "end"]


@pytest.fixture
def live_server(pg_env: Env) -> Iterator[str]:
    """A real uvicorn, so the stream is read as it is produced."""
    app = create_app(pg_env.settings, enqueue=pg_env.enqueued, token_cache_ttl_s=0,
                     stream_timing=StreamTiming(poll_s=0.02, keepalive_s=5))
    with serve_in_thread(app) as url:
        yield url


def test_sse_delivers_events_before_the_job_ends(pg_env: Env, live_server: str) -> None:
    job = pg_env.submit()
    _move(pg_env, job["id"], S.STARTING, S.RUNNING)
    headers = {**pg_env.auth(), "Accept": "text/event-stream"}
    seen: list[str] = []
    url = f"{live_server}/v1/jobs/{job['id']}/events"
    with httpx.stream("GET", url, headers=headers, timeout=10) as res:
        lines = res.iter_lines()
        for line in lines:
            if line.startswith("event:"):
                seen.append(line.split(":", 1)[1].strip())
            if seen.count("status") == 2:  # backlog read while the job still runs
                break
        assert seen == ["created", "audit", "status", "status"]
        _move(pg_env, job["id"], S.FAILED)
        rest = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("event:")]
    assert rest == ["status", "end"]


def test_metrics_series_and_checkpoints(env: Env) -> None:
    job = env.submit()
    with session_scope(env.url) as session:
        session.add_all([MetricPoint(job_id=job["id"], kind="train", step=s, loss=2.0 / s,
                                     learning_rate=1e-4, tokens_per_second=1000.0 + s,
                                     gpu_memory_bytes=2**30, host_rss_bytes=2**31) for s in (1, 2, 3)])
        session.add(MetricPoint(job_id=job["id"], kind="eval", step=3, loss=1.5))
        session.add(Checkpoint(id=new_id("ckpt"), job_id=job["id"], step=3, path="/x/ckpt-3",
                               is_final=True))
    train = env.client.get(f"/v1/jobs/{job['id']}/metrics", headers=env.auth()).json()
    assert [p["step"] for p in train["points"]] == [1, 2, 3] and train["kind"] == "train"
    first = train["points"][0]
    assert first["tokens_per_second"] == 1001.0 and first["host_rss_bytes"] == 2**31
    later = env.client.get(f"/v1/jobs/{job['id']}/metrics?after_step=2", headers=env.auth()).json()
    assert [p["step"] for p in later["points"]] == [3]
    evals = env.client.get(f"/v1/jobs/{job['id']}/metrics?kind=eval", headers=env.auth()).json()
    assert [p["loss"] for p in evals["points"]] == [1.5]
    assert env.client.get(f"/v1/jobs/{job['id']}/metrics?kind=test", headers=env.auth()).status_code == 422
    ckpts = env.client.get(f"/v1/jobs/{job['id']}/checkpoints", headers=env.auth()).json()["items"]
    assert [(c["step"], c["is_final"]) for c in ckpts] == [(3, True)]

