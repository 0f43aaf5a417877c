"""Shared fixtures: a real Postgres database and a real Redis for each test session.

Each session gets its own database (other test runs may share the server), dropped at the end.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tunebox.settings import Settings

PG_ADMIN_URL = os.environ.get("TUNEBOX_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def _admin_engine():  # noqa: ANN202 - sqlalchemy Engine
    from sqlalchemy import create_engine

    return create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


def create_pg_database(prefix: str = "tunebox_test") -> str:
    """Create an empty, uniquely named database and return its URL."""
    from sqlalchemy import text

    name = f"{prefix}_{secrets.token_hex(6)}"
    engine = _admin_engine()
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


def drop_pg_database(url: str) -> None:
    from sqlalchemy import text

    from store.db import engine_for

    name = url.rsplit("/", 1)[1]
    engine_for(url).dispose()
    engine = _admin_engine()
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


@pytest.fixture(scope="session")
def pg_empty_url() -> Iterator[str]:
    """URL of a fresh, empty Postgres database for this test session."""
    url = create_pg_database()
    yield url
    drop_pg_database(url)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of this test session's own: no other run's worker can take its messages."""
    from tests.reliability.support import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()


def truncate_all(url: str) -> None:
    """Empty every table of ``store`` (tests isolate themselves with this between cases)."""
    from sqlalchemy import text

    import store.models  # noqa: F401
    from store.base import Base
    from store.db import engine_for

    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with engine_for(url).begin() as conn:
        if url.startswith("postgresql"):
            conn.execute(text("TRUNCATE " + ", ".join(tables) + " RESTART IDENTITY CASCADE"))
        else:
            for name in tables:
                conn.execute(text(f"DELETE FROM {name}"))


@pytest.fixture(scope="session")
def pg_url(pg_empty_url: str) -> str:
    """The session's Postgres database, migrated to head with Alembic (never ``create_all``)."""
    from migrations import upgrade

    upgrade(pg_empty_url)
    return pg_empty_url


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An embedded-default SQLite file, migrated to head."""
    from migrations import upgrade

    url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'tunebox.db'}"
    upgrade(url)
    return url


# ------------------------------------------------------------------ DeepSpeed's ops, built early

#: the test folders whose runs load DeepSpeed's CPU ops through the trainer or a worker
_OP_USERS = ("worker_train", "worker", "bench", "openai", "dashboard", "reliability")
_PREBUILT = ("cpu_adam", "fused_adam", "cpu_lion")
_prebuild: dict[str, object] = {}


def _prebuild_settings() -> Settings:
    from pathlib import Path

    from tunebox.settings import Settings

    root = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    return Settings(data_dir=root, torch_extensions_dir=root, prebuild_ops=list(_PREBUILT))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the CPU ops the collected tests load in the background, as a worker does at start
    (``worker.prebuild``): single-threaded tests leave a core idle, and the first test to need an op
    waits on torch's build lock instead of building it while the clock runs. Off with
    ``TUNEBOX_TEST_PREBUILD=0`` (a run that repeats a few tests many times)."""
    from pathlib import Path

    folders = {Path(str(item.fspath)).parent.name for item in session.items}
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if (root is None or not folders & set(_OP_USERS) or os.environ.get("DS_ACCELERATOR") != "cpu"
            or os.environ.get("TUNEBOX_TEST_PREBUILD") == "0"):
        return
    from worker.launcher import start_prebuild

    # as a worker on a CPU box starts it: its log is ROOT/prebuild.log
    _prebuild["proc"] = start_prebuild(_prebuild_settings(), "cpu")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A build still running is stopped, and the build locks it held are removed: a lock left by a
    killed build would make the next run wait on it."""
    import subprocess

    proc = _prebuild.pop("proc", None)
    if isinstance(proc, subprocess.Popen):
        from worker.launcher import stop_prebuild

        stop_prebuild(proc, _prebuild_settings(), grace_s=0)
