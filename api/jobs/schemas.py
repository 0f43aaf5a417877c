"""Job schemas split by intent: what a client sends (``JobCreate``, ``JobUpdate``) and reads."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.spec import JobSpec
from store.states import JobStatus

JobCreate = JobSpec  # the body of POST /v1/jobs is the job spec, as users write it


class JobUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    priority: Annotated[int, Field(ge=-100, le=100, description="Higher runs first.")]


class Failure(BaseModel):
    kind: str | None = Field(description="`user_error` (the spec, model or data) or `error` (the system).")
    reason: str | None = Field(description="Machine-readable: cuda_oom, host_oom, worker_lost, timeout, ...")
    message: str | None


class Progress(BaseModel):
    step: int | None
    total_steps: int | None
    epoch: float | None
    loss: float | None
    learning_rate: float | None
    tokens_per_second: float | None
    samples_per_second: float | None
    eta_seconds: float | None
    measured_peak_gpu_bytes: int | None
    measured_host_rss_bytes: int | None
    host_cpu_percent: float | None
    updated_at: datetime | None


class JobSummary(BaseModel):
    """A job as lists show it (no spec or plan); another user's job without progress or failure."""

    id: str
    name: str
    owner: str
    status: JobStatus
    priority: int
    model: str | None = Field(description="The catalogue name or the model folder's name; null where the "
                              "caller may not read the job's details.")
    num_gpus: int
    planned_peak_gpu_bytes: int | None
    planned_host_bytes: int | None
    progress: Progress | None = Field(description="Null where the caller may not read the job's details.")
    failure: Failure | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobRead(JobSummary):
    """One job in full: the spec as stored (paths resolved), the plan it was accepted with."""

    progress: Progress

    spec: dict[str, Any]
    plan: dict[str, Any]
    dataset_id: str | None
    attempt: int
    worker_host: str | None
    gpu_indices: list[int] | None
    cancel_requested_at: datetime | None
    eval_status: str | None
    eval_result: dict[str, Any] | None
    log_tail: str | None
    data_report: dict[str, Any] | None = Field(
        default=None, description="What training made of the dataset: train/eval rows, tokens per row "
        "(p50/p95/max), rows truncated and dropped (and why), tokens and trained tokens.")


class JobList(BaseModel):
    items: list[JobSummary]
    next_after: str | None = Field(description="Pass as `after` for the next (older) page; null at the end.")


class Queue(BaseModel):
    """The queued jobs in the order they will start (the order the workers take them in)."""

    items: list[JobSummary]
    more: int = Field(description="Queued jobs after the last one listed.")


class EventRead(BaseModel):
    id: int
    job_id: str
    kind: str
    actor: str | None
    message: str
    data: dict[str, Any] | None
    created_at: datetime


class EventList(BaseModel):
    items: list[EventRead]
    next_after: int | None = Field(description="The last event id here; pass as `after` to continue.")


MetricKind = Literal["train", "eval"]


class MetricPointRead(BaseModel):
    step: int
    epoch: float | None
    loss: float | None
    learning_rate: float | None
    tokens_per_second: float | None
    samples_per_second: float | None
    gpu_memory_bytes: int | None
    host_rss_bytes: int | None
    host_cpu_percent: float | None
    created_at: datetime


class MetricSeries(BaseModel):
    job_id: str
    kind: MetricKind
    points: list[MetricPointRead]


class CheckpointRead(BaseModel):
    id: str
    step: int
    path: str
    size_bytes: int | None
    is_final: bool
    eval_status: str | None
    eval_result: dict[str, Any] | None
    created_at: datetime


class CheckpointList(BaseModel):
    items: list[CheckpointRead]
