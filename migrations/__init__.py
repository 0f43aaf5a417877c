"""Alembic migrations for the ``store`` models, usable from any working directory.

``upgrade(url)`` is what ``tunebox db upgrade`` and ``tunebox serve`` call; the same scripts run on
Postgres and SQLite (batch mode there, since SQLite cannot ALTER most things in place).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

HERE = Path(__file__).resolve().parent

__all__ = ["alembic_config", "current", "downgrade", "upgrade"]


def alembic_config(url: str) -> Config:
    """A Config pointing at this folder, whatever the current directory is."""
    cfg = Config(str(HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(HERE))
    # '%' is ConfigParser's interpolation character; URL-encoded passwords contain it
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def _ensure_sqlite_dir(url: str) -> None:
    if url.startswith("sqlite:///") and not url.endswith(":memory:"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)


def upgrade(url: str, revision: str = "head") -> None:
    _ensure_sqlite_dir(url)
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The revision the database is at (None for an empty database)."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
