"""jobs(owner_id, status): the per-user queued-jobs limit counts without reading a user's history

Revision ID: 0003_jobs_owner_status_index
Revises: 0002_job_dispatch_checked
Create Date: 2026-11-30 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003_jobs_owner_status_index"
down_revision: str | None = "0002_job_dispatch_checked"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_owner_status", "jobs", ["owner_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_status", table_name="jobs")
