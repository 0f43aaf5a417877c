"""``GET /v1/jobs/{id}/logs``: the training log, whole, its last lines, or followed as it grows.

The log is the job folder's ``train.log`` (every attempt appends to it) where this host can read
it, as on the embedded default or with the data folder shared between API and workers. Where it
cannot (a worker on another box), the ``log`` events the worker recorded stand in for it.
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from store import events, jobs
from store.models import Job
from store.states import JobStatus

LOG_FILE = "train.log"
CHUNK = 1 << 16
EVENT_BATCH = 500


def log_file(job_dir: str | None) -> Path | None:
    """The job's log where this host can read it, else None."""
    if not job_dir:
        return None
    path = Path(job_dir) / LOG_FILE
    return path if path.is_file() else None


def tail_offset(path: Path, lines: int) -> int:
    """Where the last ``lines`` lines of ``path`` start (a partial last line counts as one)."""
    with path.open("rb") as fh:
        end = fh.seek(0, 2)
        pos, seen = end, 0
        if lines <= 0:
            return end
        while pos > 0:
            step = min(CHUNK, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            if pos + step == end and block.endswith(b"\n"):
                block = block[:-1]  # the final newline ends the last line; it starts none
            for i in range(len(block) - 1, -1, -1):
                if block[i] == 0x0A:
                    seen += 1
                    if seen == lines:
                        return pos + i + 1
        return 0


def last_lines(text: str, lines: int | None) -> str:
    if lines is None:
        return text
    kept = text.splitlines(keepends=True)
    return "".join(kept[-lines:]) if lines > 0 else ""


@dataclass
class FileReader:
    """New text of the log file since the last read."""

    path: Path
    offset: int = 0

    def __post_init__(self) -> None:
        # a multi-byte character cut at the end of one read is completed by the next
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def read(self) -> str:
        """Up to :data:`CHUNK` bytes more; empty at the end of what is written so far."""
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read(CHUNK)
        self.offset += len(data)
        return self._decoder.decode(data)


@dataclass
class EventReader:
    """New ``log`` events of the job since the last read, as text."""

    sessions: sessionmaker[Session]
    job_id: str
    after: int = 0

    def read(self) -> str:
        with self.sessions() as session:
            rows = events.log_lines_after(session, self.job_id, self.after, EVENT_BATCH)
        if rows:
            self.after = rows[-1][0]
        return "".join(m if m.endswith("\n") else m + "\n" for _, m in rows)


Reader = FileReader | EventReader


@dataclass
class OpenLog:
    reader: Reader
    head: str  # what the response starts with, before the reader's text
    source: str  # file | events


def open_log(sessions: sessionmaker[Session], job_id: str, job_dir: str | None, tail: int | None) -> OpenLog:
    """The log positioned at its start, or ``tail`` lines from its end."""
    path = log_file(job_dir)
    if path is not None:
        return OpenLog(FileReader(path, tail_offset(path, tail) if tail is not None else 0), "", "file")
    reader = EventReader(sessions, job_id)
    text = ""
    while chunk := reader.read():  # events cannot seek from the end: read them, keep the tail
        text = last_lines(text + chunk, tail)
    return OpenLog(reader, text, "events")


async def log_text(sessions: sessionmaker[Session], job_id: str, log: OpenLog, *, follow: bool,
                   poll_s: float, disconnected: Callable[[], Awaitable[bool]]) -> AsyncIterator[str]:
    """The log's text; with ``follow``, then what is written until the job is terminal."""
    reader = log.reader
    if log.head:
        yield log.head
    while True:
        status: JobStatus | None = None
        if follow:
            status, job_dir = await run_in_threadpool(_state, sessions, job_id)
            if isinstance(reader, EventReader) and not reader.after and (path := log_file(job_dir)):
                reader = FileReader(path)  # the job started on this box: its file from the start
        while text := await run_in_threadpool(reader.read):
            yield text
        if not follow or status is None or status.terminal() or await disconnected():
            return
        await asyncio.sleep(poll_s)


def _state(sessions: sessionmaker[Session], job_id: str) -> tuple[JobStatus | None, str | None]:
    with sessions() as session:
        row = jobs.columns(session, job_id, Job.status, Job.job_dir)
    return (JobStatus(row.status), row.job_dir) if row is not None else (None, None)
