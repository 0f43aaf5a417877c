"""box_probes: what each worker measured on its box, per GPUs, driver, torch and DeepSpeed version

Revision ID: 0004_issue22_box_probes
Revises: 0003_jobs_owner_status_index
Create Date: 2026-12-02 02:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004_issue22_box_probes"
down_revision: str | None = "0003_jobs_owner_status_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# store.base's types, spelled out so this file never changes with them
BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UTC_TS = sa.DateTime(timezone=True)
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "box_probes",
        sa.Column("id", BIGINT_PK, autoincrement=True, nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("probe_key", sa.String(length=64), nullable=False),
        sa.Column("identity", JSON, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("figures", JSON, nullable=False),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.Column("updated_at", UTC_TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_box_probes")),
        sa.UniqueConstraint("host", "probe_key", name="uq_box_probes_host_key"),
    )


def downgrade() -> None:
    op.drop_table("box_probes")
