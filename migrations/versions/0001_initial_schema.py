"""Initial schema: users, tokens, datasets, jobs, events, metrics, checkpoints, GPUs, leases, idempotency keys

Revision ID: 0001
Revises:
Create Date: 2026-11-29 23:29:22.036543
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# store.base.UTCDateTime and store.base.JSONType, spelled out so this file never changes with them
UTC_TS = sa.DateTime(timezone=True)
JSON_T = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpus",
        sa.Column("id", BIGINT_PK, autoincrement=True, nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("memory_total_bytes", sa.BigInteger(), nullable=False),
        sa.Column("memory_free_bytes", sa.BigInteger(), nullable=True),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("health_reason", sa.Text(), nullable=True),
        sa.Column("updated_at", UTC_TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpus")),
        sa.UniqueConstraint("host", "index", name="uq_gpus_host_index"),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("max_queued_jobs", sa.Integer(), nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.Column("last_used_at", UTC_TS, nullable=True),
        sa.Column("revoked_at", UTC_TS, nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_api_tokens_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_index(op.f("ix_api_tokens_user_id"), "api_tokens", ["user_id"], unique=False)
    op.create_table(
        "datasets",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("num_rows", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"], name=op.f("fk_datasets_owner_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
    )
    op.create_index(op.f("ix_datasets_owner_id"), "datasets", ["owner_id"], unique=False)
    op.create_table(
        "idempotency_keys",
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("response_status", sa.Integer(), nullable=True),
        sa.Column("response_body", JSON_T, nullable=True),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_idempotency_keys_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("user_id", "key", name=op.f("pk_idempotency_keys")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "queued",
                "starting",
                "running",
                "evaluating",
                "cancelling",
                "succeeded",
                "failed",
                "cancelled",
                name="jobstatus",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("spec", JSON_T, nullable=False),
        sa.Column("plan", JSON_T, nullable=False),
        sa.Column("dataset_id", sa.String(length=32), nullable=True),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("planned_peak_gpu_bytes", sa.BigInteger(), nullable=True),
        sa.Column("planned_host_bytes", sa.BigInteger(), nullable=True),
        sa.Column("failure_kind", sa.String(length=16), nullable=True),
        sa.Column("failure_reason", sa.String(length=64), nullable=True),
        sa.Column("failure_message", sa.Text(), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("celery_task_id", sa.String(length=64), nullable=True),
        sa.Column("worker_host", sa.String(length=255), nullable=True),
        sa.Column("worker_pid", sa.Integer(), nullable=True),
        sa.Column("process_group", sa.Integer(), nullable=True),
        sa.Column("job_dir", sa.Text(), nullable=True),
        sa.Column("gpu_indices", JSON_T, nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("epoch", sa.Float(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("learning_rate", sa.Float(), nullable=True),
        sa.Column("tokens_per_second", sa.Float(), nullable=True),
        sa.Column("samples_per_second", sa.Float(), nullable=True),
        sa.Column("eta_seconds", sa.Float(), nullable=True),
        sa.Column("host_cpu_percent", sa.Float(), nullable=True),
        sa.Column("measured_peak_gpu_bytes", sa.BigInteger(), nullable=True),
        sa.Column("measured_host_rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("progress_at", UTC_TS, nullable=True),
        sa.Column("eval_status", sa.String(length=16), nullable=True),
        sa.Column("eval_result", JSON_T, nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.Column("updated_at", UTC_TS, nullable=False),
        sa.Column("started_at", UTC_TS, nullable=True),
        sa.Column("finished_at", UTC_TS, nullable=True),
        sa.Column("cancel_requested_at", UTC_TS, nullable=True),
        sa.CheckConstraint("attempt >= 0", name=op.f("ck_jobs_attempt_nonnegative")),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], name=op.f("fk_jobs_dataset_id_datasets")),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"], name=op.f("fk_jobs_owner_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index("ix_jobs_owner_created", "jobs", ["owner_id", "created_at"], unique=False)
    op.create_index(
        "ix_jobs_status_priority_created", "jobs", ["status", "priority", "created_at"], unique=False
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("is_final", sa.Boolean(), nullable=False),
        sa.Column("eval_status", sa.String(length=16), nullable=True),
        sa.Column("eval_result", JSON_T, nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_checkpoints_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),
    )
    op.create_index(op.f("ix_checkpoints_job_id"), "checkpoints", ["job_id"], unique=False)
    op.create_table(
        "gpu_leases",
        sa.Column("id", BIGINT_PK, autoincrement=True, nullable=False),
        sa.Column("gpu_id", BIGINT_PK, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("exclusive", sa.Boolean(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.Column("heartbeat_at", UTC_TS, nullable=False),
        sa.Column("expires_at", UTC_TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name=op.f("fk_gpu_leases_gpu_id_gpus"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_gpu_leases_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_leases")),
        sa.UniqueConstraint("gpu_id", "job_id", name="uq_gpu_leases_gpu_job"),
    )
    op.create_index(op.f("ix_gpu_leases_gpu_id"), "gpu_leases", ["gpu_id"], unique=False)
    op.create_index(op.f("ix_gpu_leases_job_id"), "gpu_leases", ["job_id"], unique=False)
    op.create_table(
        "job_events",
        sa.Column("id", BIGINT_PK, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.String(length=100), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", JSON_T, nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index("ix_job_events_job_id_id", "job_events", ["job_id", "id"], unique=False)
    op.create_table(
        "metric_points",
        sa.Column("id", BIGINT_PK, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Float(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("learning_rate", sa.Float(), nullable=True),
        sa.Column("tokens_per_second", sa.Float(), nullable=True),
        sa.Column("samples_per_second", sa.Float(), nullable=True),
        sa.Column("gpu_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("host_rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("host_cpu_percent", sa.Float(), nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_metric_points_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric_points")),
        sa.UniqueConstraint("job_id", "kind", "step", name="uq_metric_points_job_kind_step"),
    )
    op.create_index(op.f("ix_metric_points_job_id"), "metric_points", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_metric_points_job_id"), table_name="metric_points")
    op.drop_table("metric_points")
    op.drop_index("ix_job_events_job_id_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_index(op.f("ix_gpu_leases_job_id"), table_name="gpu_leases")
    op.drop_index(op.f("ix_gpu_leases_gpu_id"), table_name="gpu_leases")
    op.drop_table("gpu_leases")
    op.drop_index(op.f("ix_checkpoints_job_id"), table_name="checkpoints")
    op.drop_table("checkpoints")
    op.drop_index("ix_jobs_status_priority_created", table_name="jobs")
    op.drop_index("ix_jobs_owner_created", table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("idempotency_keys")
    op.drop_index(op.f("ix_datasets_owner_id"), table_name="datasets")
    op.drop_table("datasets")
    op.drop_index(op.f("ix_api_tokens_user_id"), table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_table("users")
    op.drop_table("gpus")
