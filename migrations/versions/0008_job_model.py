"""jobs.model: the model a job trains, as lists show and filter it

Revision ID: 0008_job_model
Revises: 0007_job_eval_dataset
Create Date: 2026-12-02 07:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_T = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

revision: str = "0008_job_model"
down_revision: str | None = "0007_job_eval_dataset"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _label(spec: Any) -> str | None:
    """As ``api.jobs.service.model_label`` names it (kept here: a migration must not change later)."""
    model = (spec or {}).get("model") or {}
    if model.get("name"):
        return str(model["name"])[:255]
    if model.get("path"):
        return str(model["path"]).rstrip("/").rsplit("/", 1)[-1][:255] or None
    config = model.get("config") or {}
    return str(config.get("_name_or_path") or config.get("model_type") or "")[:255] or None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("model", sa.String(length=255), nullable=True))
        batch.create_index("ix_jobs_model", ["model"])
    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("spec", JSON_T),
                    sa.column("model", sa.String))
    for job_id, spec in bind.execute(sa.select(jobs.c.id, jobs.c.spec)).all():
        bind.execute(sa.update(jobs).where(jobs.c.id == job_id).values(model=_label(spec)))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_model")
        batch.drop_column("model")
