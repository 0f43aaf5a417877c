"""From the job folder to the database: progress lines, checkpoints, the log's tail.

The training appends JSON lines to ``progress.jsonl`` and text to ``train.log``; the worker tails
both and writes at a bounded rate (``progress_interval_s``): a long run with fast steps must not
turn into a write per step. Checkpoints and the start/done records are written at once.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store import checkpoints, jobs, metrics
from store.base import utcnow
from store.db import session_scope
from store.ids import new_id
from store.models import Checkpoint, JobEvent, MetricPoint

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 60
LOG_TAIL_CHARS = 8000
LOG_EVENT_LINES = 100


class LineTail:
    """The complete lines appended to a file since the last read (a partial last line waits)."""

    def __init__(self, path: Path, from_end: bool = False) -> None:
        self.path = path
        self._offset = path.stat().st_size if from_end and path.exists() else 0
        self._partial = b""

    def read(self) -> list[str]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [line.decode("utf-8", "replace").rstrip("\r") for line in lines]


def parse_records(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            log.warning("skipping a progress line that is not JSON: %.200s", line)
            continue
        if isinstance(record, dict) and "type" in record:
            out.append(record)
    return out


def _max(*values: Any) -> int | None:
    nums = [int(v) for v in values if isinstance(v, (int, float)) and v is not None]
    return max(nums) if nums else None


@dataclass
class Peaks:
    """The largest GPU and host memory measured for the run (NVML's figure includes the context)."""

    gpu_bytes: int | None = None
    host_rss_bytes: int | None = None

    def observe(self, record: dict[str, Any]) -> None:
        self.gpu_bytes = _max(self.gpu_bytes, record.get("peak_gpu_bytes"), record.get("nvml_peak_bytes"))
        self.host_rss_bytes = _max(self.host_rss_bytes, record.get("host_rss_bytes"),
                                   record.get("host_peak_rss_bytes"))

    def observe_rss(self, rss: int | None) -> None:
        self.host_rss_bytes = _max(self.host_rss_bytes, rss)


@dataclass
class ProgressRecorder:
    """Applies progress records to the job row, its metric series and its checkpoints."""

    db_url: str
    job_id: str
    interval_s: float
    #: called with the ``start`` record before it or any record after it is applied (the job moves
    #: to running before a step of it is stored); raising leaves the record for the next call
    on_start: Callable[[dict[str, Any]], None] | None = None
    peaks: Peaks = field(default_factory=Peaks)
    started: dict[str, Any] | None = None
    done: dict[str, Any] | None = None
    paused: dict[str, Any] | None = None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    _pending: dict[str, Any] | None = None
    _last_write: float = 0.0
    _backlog: list[dict[str, Any]] = field(default_factory=list)
    _fresh: list[dict[str, Any]] = field(default_factory=list)

    def handle(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Take new records; returns the checkpoint records among them (for evaluation).

        A database error leaves the records not yet written for the next call (every write here
        can be repeated), so an outage loses none of them.
        """
        self._backlog.extend(records)
        while self._backlog:
            self._apply(self._backlog[0])
            self._backlog.pop(0)
        if self.done is not None:
            self._record_done(self.done)
        self.flush(force=False)
        fresh, self._fresh = self._fresh, []
        return fresh

    def _apply(self, record: dict[str, Any]) -> None:
        self.peaks.observe(record)
        kind = record["type"]
        if kind == "start":
            if self.on_start is not None:
                self.on_start(record)
            self.started = record
            if record.get("data"):
                self._record_data(record["data"])
        elif kind == "progress":
            self._pending = record
            if not self._last_write:
                # the first step is written at once, even when a whole run arrives in one read:
                # the loss curve always starts where the run started
                self.flush(force=True)
        elif kind == "checkpoint":
            pending = self._pending
            if pending is not None and pending.get("step") == record.get("step"):
                self.flush(force=True)  # a checkpoint's step is always on the curve, with its loss
            self._record_checkpoint(record, final=False)
            self.checkpoints.append(record)
            self._fresh.append(record)
        elif kind == "checkpoints_removed":
            self._record_removed(record)
        elif kind == "done":
            self.done = record
        elif kind == "paused":
            self.paused = record
        elif kind == "op_build":
            self._record_op_build(record)

    def flush(self, force: bool = True) -> None:
        """Write the latest progress if the interval has passed (or ``force``)."""
        if self._pending is None:
            return
        if not force and time.monotonic() - self._last_write < self.interval_s:
            return
        record = self._pending
        with session_scope(self.db_url) as s:
            jobs.set_fields(s, self.job_id, **self._job_fields(record))
            _upsert_metric(s, self.job_id, "train", record, self.peaks)
        self._last_write = time.monotonic()  # only once written: a failed first write is retried as one
        if self._pending is record:
            self._pending = None

    def _job_fields(self, r: dict[str, Any]) -> dict[str, Any]:
        fields = {"step": r.get("step"), "total_steps": r.get("total_steps"), "epoch": r.get("epoch"),
                  "loss": r.get("loss"), "learning_rate": r.get("lr"),
                  "tokens_per_second": r.get("tokens_per_second"),
                  "samples_per_second": r.get("samples_per_second"), "eta_seconds": r.get("eta_seconds"),
                  "host_cpu_percent": r.get("host_cpu_percent"), "progress_at": utcnow()}
        fields.update(self.peak_fields())
        return {k: v for k, v in fields.items() if v is not None}

    def peak_fields(self) -> dict[str, Any]:
        return {"measured_peak_gpu_bytes": self.peaks.gpu_bytes,
                "measured_host_rss_bytes": self.peaks.host_rss_bytes}

    def _record_checkpoint(self, record: dict[str, Any], final: bool) -> None:
        step, path = int(record.get("step") or 0), str(record.get("path") or record.get("final_path"))
        with session_scope(self.db_url) as s:
            row = checkpoints.at_step(s, self.job_id, step)
            if row is None:
                row = Checkpoint(id=new_id("ckpt"), job_id=self.job_id, step=step)
                s.add(row)
            row.path, row.size_bytes, row.is_final = path, folder_bytes(Path(path)), final
            s.add(JobEvent(job_id=self.job_id, kind="checkpoint", actor="worker",
                           message=f"{'final model' if final else 'checkpoint'} at step {step}",
                           data={"step": step, "path": path, "final": final}))

    def _record_removed(self, record: dict[str, Any]) -> None:
        steps = [int(x) for x in record.get("steps") or []]
        with session_scope(self.db_url) as s:
            for row in checkpoints.at_steps(s, self.job_id, steps):
                s.delete(row)
            s.add(JobEvent(job_id=self.job_id, kind="checkpoint", actor="worker",
                           message=f"removed checkpoints at steps {', '.join(map(str, steps))} "
                                   f"(training.save_total_limit {record.get('kept')})",
                           data={"removed_steps": steps, "kept": record.get("kept")}))

    def _record_op_build(self, record: dict[str, Any]) -> None:
        op = str(record.get("op"))
        message = (f"waiting for DeepSpeed's {op} op, which another process is building (once a box)"
                   if record.get("waiting") else
                   f"building DeepSpeed's {op} op (once a box: later jobs load it)")
        with session_scope(self.db_url) as s:
            s.add(JobEvent(job_id=self.job_id, kind="op_build", actor="worker", message=message,
                           data={"op": op, "waiting": bool(record.get("waiting"))}))

    def _record_data(self, report: dict[str, Any]) -> None:
        """The trainer's account of the dataset, on the job and as an event (every row accounted for)."""
        dropped = ", ".join(f"{n} {why}" for why, n in report.get("dropped", {}).items()) or "none"
        message = (f"dataset: {report.get('kept_rows')} of {report.get('rows')} training rows kept, "
                   f"{report.get('eval_rows')} eval rows, {report.get('truncated_rows')} truncated to "
                   f"seq_len {report.get('seq_len')}, dropped: {dropped}; {report.get('tokens')} tokens, "
                   f"{report.get('trained_tokens')} trained")
        with session_scope(self.db_url) as s:
            jobs.set_fields(s, self.job_id, data_report=report)
            s.add(JobEvent(job_id=self.job_id, kind="data", actor="worker", message=message, data=report))

    def _record_done(self, record: dict[str, Any]) -> None:
        if record.get("_recorded"):
            return
        self.flush(force=True)
        if record.get("final_path"):
            self._record_checkpoint(record, final=True)
        record["_recorded"] = True


def _upsert_metric(session: Any, job_id: str, kind: str, r: dict[str, Any], peaks: Peaks | None) -> None:
    step = int(r.get("step") or 0)
    row = metrics.at_step(session, job_id, kind, step)
    if row is None:
        row = MetricPoint(job_id=job_id, kind=kind, step=step)
        session.add(row)
    row.epoch, row.loss, row.learning_rate = r.get("epoch"), r.get("loss"), r.get("lr")
    row.tokens_per_second, row.samples_per_second = r.get("tokens_per_second"), r.get("samples_per_second")
    row.gpu_memory_bytes = _max(r.get("peak_gpu_bytes"), r.get("nvml_peak_bytes"))
    row.host_rss_bytes, row.host_cpu_percent = r.get("host_rss_bytes"), r.get("host_cpu_percent")


def record_eval_metric(db_url: str, job_id: str, step: int, eval_loss: float | None) -> None:
    with session_scope(db_url) as s:
        _upsert_metric(s, job_id, "eval", {"step": step, "loss": eval_loss}, None)


def folder_bytes(path: Path) -> int | None:
    if not path.exists():
        return None
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class LogFollower:
    """Tails a log: new lines become ``log`` events and the job's ``log_tail``, at a bounded rate."""

    def __init__(self, path: Path, db_url: str, job_id: str, interval_s: float,
                 from_end: bool = False) -> None:
        self.tail = LineTail(path, from_end)
        self.db_url, self.job_id, self.interval_s = db_url, job_id, interval_s
        self.last_lines: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._pending: list[str] = []
        self._last_write = 0.0

    def poll(self, force: bool = False) -> None:
        lines = self.tail.read()
        self.last_lines.extend(lines)
        self._pending.extend(lines)
        if not self._pending or (not force and time.monotonic() - self._last_write < self.interval_s):
            return
        self._last_write = time.monotonic()
        self._write()

    def text(self) -> str:
        return "\n".join(self.last_lines)[-LOG_TAIL_CHARS:]

    def _write(self) -> None:
        lines = self._pending
        skipped = max(0, len(lines) - LOG_EVENT_LINES)
        shown = lines[-LOG_EVENT_LINES:]
        message = ("\n".join(shown))[-LOG_TAIL_CHARS:]
        if skipped:
            message = f"[{skipped} earlier lines in {self.tail.path.name}]\n" + message
        with session_scope(self.db_url) as s:
            s.add(JobEvent(job_id=self.job_id, kind="log", actor="worker", message=message,
                           data={"file": self.tail.path.name, "lines": len(lines)}))
            jobs.set_fields(s, self.job_id, log_tail=self.text())
        self._pending = self._pending[len(lines):]  # written; kept until then for a database outage
