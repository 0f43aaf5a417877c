"""jobs.data_report: what the trainer made of the dataset (rows and tokens trained, truncated, dropped)

Revision ID: 0005_issue23_job_data_report
Revises: 0004_issue23_dataset_sharing
Create Date: 2026-12-02 02:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# store.base.JSONType, spelled out so this file never changes with it
JSON_T = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

revision: str = "0005_issue23_job_data_report"
down_revision: str | None = "0004_issue23_dataset_sharing"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("data_report", JSON_T, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("data_report")
