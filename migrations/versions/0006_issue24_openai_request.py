"""jobs.openai_request: the fields of a job created through POST /v1/fine_tuning/jobs

Revision ID: 0006_issue24_openai_request
Revises: 0005_issue23_job_data_report
Create Date: 2026-12-02 02:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_T = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

revision: str = "0006_issue24_openai_request"
down_revision: str | None = "0005_issue23_job_data_report"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("openai_request", JSON_T, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("openai_request")
