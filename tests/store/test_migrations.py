"""The Alembic migrations build exactly the models' schema, on Postgres and on SQLite, and unwind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

import migrations
import store.models  # noqa: F401
from store.base import Base
from tests.conftest import create_pg_database, drop_pg_database


@pytest.fixture(params=["postgresql", "sqlite"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgresql":
        url = create_pg_database("tunebox_mig")
        yield url
        drop_pg_database(url)
    else:
        yield f"sqlite:///{tmp_path / 'm.db'}"


def _diff(url: str) -> list[object]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_migrations_match_models(empty_url: str) -> None:
    migrations.upgrade(empty_url)
    assert migrations.current(empty_url) is not None
    assert _diff(empty_url) == []
    assert _tables(empty_url) == set(Base.metadata.tables)


def test_downgrade_to_base_and_upgrade_again(empty_url: str) -> None:
    migrations.upgrade(empty_url)
    migrations.downgrade(empty_url, "base")
    assert _tables(empty_url) == set()
    assert migrations.current(empty_url) is None
    migrations.upgrade(empty_url)
    assert _diff(empty_url) == []


def test_config_works_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'sub' / 'x.db'}"
    migrations.upgrade(url)  # also creates the folder of the SQLite file
    assert "jobs" in _tables(url)
