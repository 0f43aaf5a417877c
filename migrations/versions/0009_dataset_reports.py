"""dataset_reports: what training makes of a dataset with a tokenizer at a seq_len, for refusing at submit

Revision ID: 0009_dataset_reports
Revises: 0008_job_model
Create Date: 2026-12-02 15:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009_dataset_reports"
down_revision: str | None = "0008_job_model"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# store.base's types, spelled out so this file never changes with them
BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UTC_TS = sa.DateTime(timezone=True)
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "dataset_reports",
        sa.Column("id", BIGINT_PK, autoincrement=True, nullable=False),
        sa.Column("dataset_key", sa.String(length=64), nullable=False),
        sa.Column("model_key", sa.String(length=64), nullable=False),
        sa.Column("seq_len", sa.Integer(), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("report", JSON, nullable=False),
        sa.Column("updated_at", UTC_TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_reports")),
        sa.UniqueConstraint("dataset_key", "model_key", "seq_len", "format", "name",
                            name="uq_dataset_reports_key"),
    )


def downgrade() -> None:
    op.drop_table("dataset_reports")
