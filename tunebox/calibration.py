"""Planned against measured, per box: what each box's finished jobs say about its plans.

Every succeeded job keeps its plan and, next to it, what it measured (``jobs``: tokens/s, the GPU
peak as PyTorch and NVML saw it, the host RSS peak). ``calibration`` reads them per box for
``GET /v1/calibration`` and the Prometheus metrics; the box's step-time factor and memory correction
that plans apply are ``tunebox.gpus.learned_corrections``.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel

from store import jobs
from store.models import Job

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["BoxCalibration", "CalibrationReport", "JobCalibration", "calibration"]

#: Latest succeeded jobs read per box.
JOBS_PER_BOX = 100


class JobCalibration(BaseModel):
    """One finished job: measured over planned (above 1: the plan was short)."""

    job_id: str
    finished_at: datetime | None
    planned_tokens_per_second: float | None
    measured_tokens_per_second: float | None
    #: planned over measured tokens/s, times the step-time factor the plan already carried: the
    #: step-time factor this job alone would have taught the planner
    step_time_ratio: float | None
    planned_peak_gpu_bytes: int | None
    measured_peak_gpu_bytes: int | None
    gpu_peak_ratio: float | None
    planned_host_bytes: int | None
    measured_host_rss_bytes: int | None
    host_peak_ratio: float | None


class Spread(BaseModel):
    """A ratio's median and range over a box's jobs, and its median error (|ratio - 1|)."""

    jobs: int
    median: float | None
    low: float | None
    high: float | None
    median_abs_error: float | None


class BoxCalibration(BaseModel):
    host: str
    jobs: int
    #: the factor plans for this box apply (None: too few jobs yet)
    step_time_factor: float | None
    #: the scale of the allocator's slack and the CUDA context plans for this box apply (None: too few
    #: jobs yet; tunebox.gpus.learned_corrections)
    gpu_memory_correction: float | None
    step_time: Spread
    gpu_peak: Spread
    host_peak: Spread
    history: list[JobCalibration]  # newest first


class CalibrationReport(BaseModel):
    boxes: list[BoxCalibration]


def _ratio(measured: float | None, planned: float | None) -> float | None:
    if measured is None or planned is None or planned <= 0 or measured <= 0:
        return None
    return round(measured / planned, 4)


def _spread(values: list[float | None]) -> Spread:
    seen = [v for v in values if v is not None]
    if not seen:
        return Spread(jobs=0, median=None, low=None, high=None, median_abs_error=None)
    return Spread(
        jobs=len(seen),
        median=round(statistics.median(seen), 4),
        low=min(seen),
        high=max(seen),
        median_abs_error=round(statistics.median(abs(v - 1) for v in seen), 4),
    )


def _job(row: Job) -> JobCalibration:
    planned = row.plan.get("estimated_tokens_per_second") if isinstance(row.plan, dict) else None
    carried = row.plan.get("step_time_factor") or 1.0 if isinstance(row.plan, dict) else 1.0
    planned_tps = float(planned) if isinstance(planned, int | float) else None
    step = _ratio(planned_tps * float(carried) if planned_tps else None, row.tokens_per_second)
    return JobCalibration(
        job_id=row.id,
        finished_at=row.finished_at,
        planned_tokens_per_second=planned_tps,
        measured_tokens_per_second=row.tokens_per_second,
        step_time_ratio=step,
        planned_peak_gpu_bytes=row.planned_peak_gpu_bytes,
        measured_peak_gpu_bytes=row.measured_peak_gpu_bytes,
        gpu_peak_ratio=_ratio(row.measured_peak_gpu_bytes, row.planned_peak_gpu_bytes),
        planned_host_bytes=row.planned_host_bytes,
        measured_host_rss_bytes=row.measured_host_rss_bytes,
        host_peak_ratio=_ratio(row.measured_host_rss_bytes, row.planned_host_bytes),
    )


def calibration(session: Session, host: str | None = None) -> CalibrationReport:
    """Every box's (or ``host``'s) latest succeeded jobs, planned against measured."""
    from tunebox.gpus import learned_corrections

    boxes = []
    for box in jobs.succeeded_hosts(session, host):
        history = [_job(r) for r in jobs.latest_succeeded_on(session, box, JOBS_PER_BOX)]
        learned = learned_corrections(session, box)
        boxes.append(
            BoxCalibration(
                host=box,
                jobs=len(history),
                step_time_factor=learned.step_time_factor,
                gpu_memory_correction=learned.gpu_memory_correction,
                step_time=_spread([j.step_time_ratio for j in history]),
                gpu_peak=_spread([j.gpu_peak_ratio for j in history]),
                host_peak=_spread([j.host_peak_ratio for j in history]),
                history=history,
            )
        )
    return CalibrationReport(boxes=boxes)
