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


def test_jobs_stored_before_the_model_column_get_their_model(empty_url: str) -> None:
    from datetime import UTC, datetime

    from sqlalchemy import JSON, MetaData, Table, insert, select
    from sqlalchemy.dialects import postgresql

    from api.jobs.service import model_label
    from planner.spec import JobSpec

    migrations.upgrade(empty_url, "0007_job_eval_dataset")
    models = [{"path": "/models/Qwen2.5-7B/"}, {"name": "meta-llama/Llama-3.1-8B"},
              {"config": {"model_type": "llama", "hidden_size": 64}}]
    specs = [{"model": m, "training": {"max_steps": 1}} for m in models]
    now = datetime.now(UTC)
    engine = create_engine(empty_url)
    try:
        meta = MetaData()
        users, jobs = (Table(name, meta, autoload_with=engine) for name in ("users", "jobs"))
        if engine.dialect.name == "sqlite":  # reflected as text there: write JSON as the ORM does
            jobs.c.spec.type = jobs.c.plan.type = JSON()
        else:
            assert isinstance(jobs.c.spec.type, postgresql.JSONB)
        with engine.begin() as conn:
            conn.execute(insert(users).values(id="usr_1", name="alice", is_admin=False, created_at=now))
            for i, spec in enumerate(specs):
                conn.execute(insert(jobs).values(id=f"job_{i}", owner_id="usr_1", name="j", status="queued",
                                                 priority=0, spec=spec, plan={}, num_gpus=1, attempt=0,
                                                 created_at=now, updated_at=now))
        migrations.upgrade(empty_url)
        with engine.connect() as conn:
            after = Table("jobs", MetaData(), autoload_with=conn)
            got = dict(conn.execute(select(after.c.id, after.c.model)).all())
    finally:
        engine.dispose()
    expected = [model_label(JobSpec.model_validate(spec)) for spec in specs]
    assert expected == ["Qwen2.5-7B", "meta-llama/Llama-3.1-8B", "llama"]
    assert [got[f"job_{i}"] for i in range(3)] == expected
