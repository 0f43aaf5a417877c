"""Fixtures of the worker tests: a migrated Postgres database per test module."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import create_pg_database, drop_pg_database

REPO = Path(__file__).resolve().parents[2]
ALEMBIC_INI = REPO / "migrations" / "alembic.ini"


def migrate(url: str) -> None:
    """Bring an empty database to the schema the service runs on: ``alembic upgrade head``."""
    subprocess.run([sys.executable, "-m", "alembic", "-c", str(ALEMBIC_INI), "upgrade", "head"],
                   cwd=REPO, check=True, capture_output=True,
                   env={**os.environ, "TUNEBOX_DATABASE_URL": url})


@pytest.fixture(scope="module")
def db_url() -> Iterator[str]:
    url = create_pg_database("tunebox_worker")
    migrate(url)
    yield url
    drop_pg_database(url)
