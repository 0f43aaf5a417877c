"""jobs.eval_dataset_id: the dataset a job evaluates on, when it is not a share of the training file

Revision ID: 0007_job_eval_dataset
Revises: 0006_issue24_openai_request
Create Date: 2026-12-02 06:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_job_eval_dataset"
down_revision: str | None = "0006_issue24_openai_request"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("eval_dataset_id", sa.String(length=32), nullable=True))
        batch.create_foreign_key(op.f("fk_jobs_eval_dataset_id_datasets"), "datasets", ["eval_dataset_id"],
                                 ["id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(op.f("fk_jobs_eval_dataset_id_datasets"), type_="foreignkey")
        batch.drop_column("eval_dataset_id")
