"""The tables. Schema changes go through Alembic (``migrations/``), never ``create_all``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from store.base import Base, JSONType, UTCDateTime, utcnow
from store.status import JobStatus

# BIGINT on Postgres, INTEGER (the rowid alias, so it autoincrements) on SQLite.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    max_gpus: Mapped[int | None] = mapped_column(Integer)
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    tokens: Mapped[list[ApiToken]] = relationship(back_populates="user")


class ApiToken(Base):
    """A bearer token; only its SHA-256 is stored, the token itself is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    user: Mapped[User] = relationship(back_populates="tokens")


class Dataset(Base):
    __tablename__ = "datasets"
    # a repeat upload by its owner is found by its hash
    __table_args__ = (Index("ix_datasets_owner_sha256", "owner_id", "sha256"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    path: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(16))
    num_rows: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    # the owner's explicit share: every user may list, read and train on it
    shared: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class DatasetReport(Base):
    """What training makes of one dataset file with one tokenizer at one ``seq_len`` (rows, tokens,
    rows dropped and why): the report of ``worker/inspect_data.py`` or of a job's trainer, kept so a
    later submission of the same data, tokenizer and length is refused before it is queued."""

    __tablename__ = "dataset_reports"
    __table_args__ = (UniqueConstraint("dataset_key", "model_key", "seq_len", "format", "name",
                                       name="uq_dataset_reports_key"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    dataset_key: Mapped[str] = mapped_column(String(64))  # the file's resolved path, size and mtime
    model_key: Mapped[str] = mapped_column(String(64))  # the tokenizer files' paths, sizes and mtimes
    seq_len: Mapped[int] = mapped_column(Integer)
    format: Mapped[str] = mapped_column(String(16))  # as declared (auto included)
    name: Mapped[str] = mapped_column(String(256))  # a dataset_info.json entry, or ""
    report: Mapped[dict[str, Any]] = mapped_column(JSONType)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint("attempt >= 0", name="attempt_nonnegative"),
        Index("ix_jobs_status_priority_created", "status", "priority", "created_at"),
        Index("ix_jobs_owner_created", "owner_id", "created_at"),
        # the per-user queued-jobs limit counts one owner's jobs in one state
        Index("ix_jobs_owner_status", "owner_id", "status"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[JobStatus] = mapped_column(
        Enum(JobStatus, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e]),
        default=JobStatus.QUEUED,
    )
    priority: Mapped[int] = mapped_column(Integer, default=0)
    # the model as lists show and filter it: the folder's name, the catalogue name
    model: Mapped[str | None] = mapped_column(String(255), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONType)
    plan: Mapped[dict[str, Any]] = mapped_column(JSONType)
    # what the trainer made of the dataset: rows and tokens trained, rows truncated and dropped
    data_report: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    dataset_id: Mapped[str | None] = mapped_column(ForeignKey("datasets.id"))
    # the evaluation rows' dataset, when the spec names one (eval.dataset.id)
    eval_dataset_id: Mapped[str | None] = mapped_column(ForeignKey("datasets.id"))
    num_gpus: Mapped[int] = mapped_column(Integer, default=1)
    planned_peak_gpu_bytes: Mapped[int | None] = mapped_column(BigInteger)
    planned_host_bytes: Mapped[int | None] = mapped_column(BigInteger)

    # failure: whose fault (user_error | error) and a machine-readable reason
    failure_kind: Mapped[str | None] = mapped_column(String(16))
    failure_reason: Mapped[str | None] = mapped_column(String(64))
    failure_message: Mapped[str | None] = mapped_column(Text)
    log_tail: Mapped[str | None] = mapped_column(Text)

    attempt: Mapped[int] = mapped_column(Integer, default=0)
    celery_task_id: Mapped[str | None] = mapped_column(String(64))
    worker_host: Mapped[str | None] = mapped_column(String(255))
    worker_pid: Mapped[int | None] = mapped_column(Integer)
    process_group: Mapped[int | None] = mapped_column(Integer)
    job_dir: Mapped[str | None] = mapped_column(Text)
    gpu_indices: Mapped[list[int] | None] = mapped_column(JSONType)

    # progress, written by the worker at a bounded rate
    step: Mapped[int | None] = mapped_column(Integer)
    total_steps: Mapped[int | None] = mapped_column(Integer)
    epoch: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    learning_rate: Mapped[float | None] = mapped_column(Float)
    tokens_per_second: Mapped[float | None] = mapped_column(Float)
    samples_per_second: Mapped[float | None] = mapped_column(Float)
    eta_seconds: Mapped[float | None] = mapped_column(Float)
    host_cpu_percent: Mapped[float | None] = mapped_column(Float)
    measured_peak_gpu_bytes: Mapped[int | None] = mapped_column(BigInteger)
    measured_host_rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    eval_status: Mapped[str | None] = mapped_column(String(16))
    eval_result: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # a job created through POST /v1/fine_tuning/jobs: that request's fields as accepted
    openai_request: Mapped[dict[str, Any] | None] = mapped_column(JSONType)

    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # last time a worker saw this job waiting in the queue; a queued job silent for long is sent again
    dispatch_checked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class JobEvent(Base):
    """Append-only log of what happened to a job; the id orders events and is the SSE event id."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))  # status | log | checkpoint | eval | audit | ...
    actor: Mapped[str | None] = mapped_column(String(100))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class MetricPoint(Base):
    __tablename__ = "metric_points"
    __table_args__ = (
        UniqueConstraint("job_id", "kind", "step", name="uq_metric_points_job_kind_step"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16), default="train")  # train | eval
    step: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    learning_rate: Mapped[float | None] = mapped_column(Float)
    tokens_per_second: Mapped[float | None] = mapped_column(Float)
    samples_per_second: Mapped[float | None] = mapped_column(Float)
    gpu_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    host_rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    host_cpu_percent: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    is_final: Mapped[bool] = mapped_column(Boolean, default=False)
    eval_status: Mapped[str | None] = mapped_column(String(16))
    eval_result: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class IdempotencyKey(Base):
    """``Idempotency-Key`` of ``POST /v1/jobs``: same key + same body → the stored response."""

    __tablename__ = "idempotency_keys"

    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default="in_flight")  # in_flight | done
    response_status: Mapped[int | None] = mapped_column(Integer)
    response_body: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    job_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Gpu(Base):
    """The inventory a worker reports for its box (NVML, or settings where there is no GPU)."""

    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("host", "index", name="uq_gpus_host_index"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(String(255))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(128))
    memory_total_bytes: Mapped[int] = mapped_column(BigInteger)
    memory_free_bytes: Mapped[int | None] = mapped_column(BigInteger)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    health_reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class GpuLease(Base):
    """A job's hold on one GPU; carries a heartbeat and expires if the holder goes silent."""

    __tablename__ = "gpu_leases"
    __table_args__ = (UniqueConstraint("gpu_id", "job_id", name="uq_gpu_leases_gpu_job"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    exclusive: Mapped[bool] = mapped_column(Boolean, default=True)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class BoxProbe(Base):
    """What a worker measured on its box for one set of GPUs, driver, torch and DeepSpeed versions
    (``tunebox/probe.py``); a change of any of them is a new row."""

    __tablename__ = "box_probes"
    __table_args__ = (UniqueConstraint("host", "probe_key", name="uq_box_probes_host_key"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(String(255))
    probe_key: Mapped[str] = mapped_column(String(64))
    identity: Mapped[dict[str, Any]] = mapped_column(JSONType)  # GPU UUIDs, driver, torch, DeepSpeed
    status: Mapped[str] = mapped_column(String(16))  # ok | failed
    error: Mapped[str | None] = mapped_column(Text)
    figures: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
