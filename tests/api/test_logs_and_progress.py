"""The training log over HTTP (whole, tail, follow; from the job folder, or the log events where
the folder is on another box) and progress events on the SSE stream, as the worker records them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from api.app import create_app
from api.jobs.logs import tail_offset
from api.jobs.stream import StreamTiming
from store.db import session_scope
from store.models import Job, JobEvent
from store.states import JobStatus, transition
from tests.api.conftest import Env, serve_in_thread
from worker.progress import ProgressRecorder

S = JobStatus
LOG = "attempt 1: loading\nstep 1 loss 2.0\n" + "".join(f"line {i} ✓\n" for i in range(5000)) + "done"


def _job_with_log(env: Env, tmp_path: Path, text: str = LOG) -> str:
    job_id = env.submit()["id"]
    folder = tmp_path / "jobs" / job_id
    folder.mkdir(parents=True)
    (folder / "train.log").write_text(text, encoding="utf-8")
    with session_scope(env.url) as session:
        session.execute(update(Job).where(Job.id == job_id).values(job_dir=str(folder)))
    return job_id


def _move(env: Env, job_id: str, *targets: JobStatus) -> None:
    with session_scope(env.url) as session:
        for target in targets:
            transition(session, job_id, target, actor="worker")


def test_the_whole_log_and_its_tail_from_the_job_folder(pg_env: Env, tmp_path: Path) -> None:
    job_id = _job_with_log(pg_env, tmp_path)
    res = pg_env.client.get(f"/v1/jobs/{job_id}/logs", headers=pg_env.auth())
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/plain")
    assert res.headers["x-log-source"] == "file"
    assert res.text == LOG  # every line, far more than the job's log_tail keeps
    tail = pg_env.client.get(f"/v1/jobs/{job_id}/logs?tail=3", headers=pg_env.auth()).text
    assert tail == "line 4998 ✓\nline 4999 ✓\ndone"
    assert pg_env.client.get(f"/v1/jobs/{job_id}/logs?tail=0", headers=pg_env.auth()).text == ""
    assert pg_env.client.get(f"/v1/jobs/{job_id}/logs?tail=-1", headers=pg_env.auth()).status_code == 422
    assert pg_env.client.get(f"/v1/jobs/{job_id}/logs", headers=pg_env.auth("bob")).status_code == 404
    assert pg_env.client.get(f"/v1/jobs/{job_id}/logs", headers=pg_env.auth("root")).text == LOG


def test_the_tail_offset_across_read_blocks(tmp_path: Path) -> None:
    path = tmp_path / "log"
    lines = [f"{i:06d}" * 30 for i in range(3000)]  # ~540 KB: the search crosses many 64 KiB blocks
    for text in ("\n".join(lines) + "\n", "\n".join(lines)):
        path.write_text(text)
        data = path.read_bytes()
        for n in (1, 2, 500, 2999):
            assert data[tail_offset(path, n):].decode().splitlines() == lines[-n:], n
        assert tail_offset(path, 3000) == 0 and tail_offset(path, 10_000) == 0


def test_the_log_events_stand_in_where_the_folder_is_not_here(pg_env: Env) -> None:
    job_id = pg_env.submit()["id"]
    with session_scope(pg_env.url) as session:
        session.execute(update(Job).where(Job.id == job_id).values(job_dir="/elsewhere/jobs/x"))
        session.add_all([JobEvent(job_id=job_id, kind="log", message="a\nb"),
                         JobEvent(job_id=job_id, kind="status", message="not a log line"),
                         JobEvent(job_id=job_id, kind="log", message="c")])
    res = pg_env.client.get(f"/v1/jobs/{job_id}/logs", headers=pg_env.auth())
    assert res.headers["x-log-source"] == "events" and res.text == "a\nb\nc\n"
    assert pg_env.client.get(f"/v1/jobs/{job_id}/logs?tail=2", headers=pg_env.auth()).text == "b\nc\n"


@pytest.fixture
def live(pg_env: Env) -> Iterator[str]:
    app = create_app(pg_env.settings, enqueue=pg_env.enqueued, token_cache_ttl_s=0,
                     stream_timing=StreamTiming(poll_s=0.02, keepalive_s=5))
    with serve_in_thread(app) as url:
        yield url


def test_follow_sends_the_log_as_it_grows_and_ends_with_the_job(pg_env: Env, live: str,
                                                                 tmp_path: Path) -> None:
    job_id = _job_with_log(pg_env, tmp_path, "first\n")
    _move(pg_env, job_id, S.STARTING, S.RUNNING)
    log = tmp_path / "jobs" / job_id / "train.log"
    received = ""
    with httpx.stream("GET", f"{live}/v1/jobs/{job_id}/logs?follow=true&tail=1", headers=pg_env.auth(),
                      timeout=30) as res:
        chunks = res.iter_text()
        for chunk in chunks:
            received += chunk
            if received == "first\n":
                with log.open("a") as fh:
                    fh.write("second\n")
            if received == "first\nsecond\n":
                with log.open("a") as fh:
                    fh.write("last\n")
                _move(pg_env, job_id, S.SUCCEEDED)
        # the stream ended by itself once the job was terminal, with the lines written before
    assert received == "first\nsecond\nlast\n"


def test_sse_carries_progress_as_the_worker_records_it(pg_env: Env, live: str) -> None:
    job_id = pg_env.submit()["id"]
    _move(pg_env, job_id, S.STARTING, S.RUNNING)
    recorder = ProgressRecorder(pg_env.url, job_id, interval_s=0)
    recorder.handle([{"type": "progress", "step": 1, "total_steps": 10, "loss": 2.5,
                      "tokens_per_second": 1500.0, "peak_gpu_bytes": 2**30}])
    headers = {**pg_env.auth(), "Accept": "text/event-stream"}
    progress: list[dict[str, object]] = []
    kinds: list[str] = []
    with httpx.stream("GET", f"{live}/v1/jobs/{job_id}/events", headers=headers, timeout=30) as res:
        frame: dict[str, str] = {}
        for line in res.iter_lines():
            if line:
                key, _, value = line.partition(": ")
                frame[key] = value
                continue
            if "event" in frame:
                kinds.append(frame["event"])
            if frame.get("event") == "progress":
                assert "id" not in frame  # a snapshot: Last-Event-ID stays on the persisted events
                progress.append(json.loads(frame["data"]))
                if len(progress) == 1:
                    recorder.handle([{"type": "progress", "step": 2, "total_steps": 10, "loss": 2.25,
                                      "tokens_per_second": 1600.0}])
                else:
                    _move(pg_env, job_id, S.SUCCEEDED)
            frame = {}
    assert [(p["step"], p["loss"], p["tokens_per_second"]) for p in progress] == [(1, 2.5, 1500.0),
                                                                                   (2, 2.25, 1600.0)]
    assert progress[0]["job_id"] == job_id and progress[0]["measured_peak_gpu_bytes"] == 2**30
    assert kinds[:4] == ["created", "audit", "status", "status"] and kinds[-2:] == ["status", "end"]
