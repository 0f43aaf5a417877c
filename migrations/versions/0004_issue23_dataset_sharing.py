"""datasets.shared (an owner's explicit share with the team); datasets(owner_id, sha256) finds a repeat upload

Revision ID: 0004_issue23_dataset_sharing
Revises: 0003_jobs_owner_status_index
Create Date: 2026-12-02 02:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_issue23_dataset_sharing"
down_revision: str | None = "0003_jobs_owner_status_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("shared", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_index("ix_datasets_owner_sha256", "datasets", ["owner_id", "sha256"])


def downgrade() -> None:
    op.drop_index("ix_datasets_owner_sha256", table_name="datasets")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("shared")
