"""The pool's check of idle connections (store.db.ping_after_idle), on the real Postgres."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from store import db


@pytest.fixture
def engine(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 0.3)
    made = db.make_engine(pg_url, pool_size=1, max_overflow=0)
    pings: list[object] = []
    ping = made.dialect.do_ping

    def counted(conn: object) -> bool:
        pings.append(conn)
        return bool(ping(conn))

    monkeypatch.setattr(made.dialect, "do_ping", counted)
    yield made, pings
    made.dispose()


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("select pg_backend_pid()")).scalar_one())


def test_a_connection_given_back_a_moment_ago_is_not_pinged(engine: tuple[Engine, list[object]]) -> None:
    made, pings = engine
    first = _backend_pid(made)
    assert [_backend_pid(made) for _ in range(5)] == [first] * 5
    assert pings == []


def test_a_connection_the_server_dropped_while_idle_is_replaced(engine: tuple[Engine, list[object]],
                                                               pg_url: str) -> None:
    made, pings = engine
    stale = _backend_pid(made)
    other = db.make_engine(pg_url, pool_size=1, max_overflow=0)
    try:
        with other.connect() as conn:
            assert conn.execute(text("select pg_terminate_backend(:pid)"), {"pid": stale}).scalar_one()
    finally:
        other.dispose()
    time.sleep(0.5)
    fresh = _backend_pid(made)  # without the check, this statement would fail on the dropped one
    assert fresh != stale
    assert len(pings) == 1
