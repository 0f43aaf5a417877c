"""The Server-Sent Events form of ``GET /v1/jobs/{id}/events``.

Each event is sent with ``id:`` = its database id, so a client that reconnects with
``Last-Event-ID`` continues where it left off. The stream polls the database (the worker writes
events from another process), sends keepalive comments while nothing happens, and ends with an
``end`` event once the job is terminal and its backlog is sent.

Between them come ``progress`` events (step, loss, tokens/s, memory: the job's ``progress``
object) each time the worker records a new step, at the progress rate (``progress_interval_s``).
They carry no ``id:``: progress is a snapshot, not part of the persisted history, so a reconnect
resumes the history where it was and gets the latest progress again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from api.jobs.schemas import EventRead, Progress
from api.jobs.service import events_after, job_status_and_progress
from store.states import JobStatus

BATCH = 500


@dataclass(frozen=True)
class StreamTiming:
    poll_s: float = 0.5
    keepalive_s: float = 15.0


def format_event(ev: EventRead) -> str:
    data = json.dumps(ev.model_dump(mode="json"), separators=(",", ":"))
    return f"id: {ev.id}\nevent: {ev.kind}\ndata: {data}\n\n"


def format_progress(job_id: str, progress: Progress) -> str:
    data = json.dumps({"job_id": job_id, **progress.model_dump(mode="json")}, separators=(",", ":"))
    return f"event: progress\ndata: {data}\n\n"


def _poll(sessions: sessionmaker[Session], job_id: str, after: int
          ) -> tuple[JobStatus | None, list[EventRead], Progress | None]:
    with sessions() as session:
        # status first: an event written with a terminal transition commits with it, so every
        # event up to the end is visible to the read that follows
        status, progress = job_status_and_progress(session, job_id)
        return status, events_after(session, job_id, after, BATCH), progress


async def event_stream(sessions: sessionmaker[Session], job_id: str, after: int, timing: StreamTiming,
                       disconnected: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[str]:
    yield f"retry: {int(timing.poll_s * 4000)}\n\n"
    last_sent = time.monotonic()
    progress_at = None
    while True:
        status, batch, progress = await run_in_threadpool(_poll, sessions, job_id, after)
        for ev in batch:
            yield format_event(ev)
            after = ev.id
        if progress is not None and progress.updated_at != progress_at:
            yield format_progress(job_id, progress)
            progress_at = progress.updated_at
            last_sent = time.monotonic()
        if batch:
            last_sent = time.monotonic()
        if status is None or (status.terminal() and len(batch) < BATCH):
            final = status.value if status else "deleted"
            yield f"event: end\ndata: {json.dumps({'status': final})}\n\n"
            return
        if disconnected is not None and await disconnected():
            return
        if time.monotonic() - last_sent >= timing.keepalive_s:
            yield ": keepalive\n\n"
            last_sent = time.monotonic()
        if len(batch) < BATCH:
            await asyncio.sleep(timing.poll_s)
