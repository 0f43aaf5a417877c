"""Engines and sessions. One request (or one task step) = one unit of work = one ``session_scope``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

#: A pooled connection that has sat idle this long is pinged when it is checked out, and replaced if
#: the server no longer answers on it (a restarted database leaves such connections in the pool).
#: One given back more recently is taken as it is: under load that spares every request a round trip.
PING_AFTER_IDLE_S = 1.0


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL lets the API read while the embedded worker writes; busy_timeout waits out a writer
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str, **kwargs: Any) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    engine = create_engine(url, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        ping_after_idle(engine, PING_AFTER_IDLE_S)
    return engine


def ping_after_idle(engine: Engine, idle_s: float) -> None:
    """Check a pooled connection idle for ``idle_s`` or more before handing it out; one that fails
    the check is discarded and the pool hands out another (it tries three times)."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is None or time.monotonic() - since < idle_s:
            return  # a new connection, or one in use a moment ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError(f"a pooled connection idle for {time.monotonic() - since:.0f} s "
                                     f"failed its check: {exc}") from exc


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    return make_engine(url)


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(bind=engine_for(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """Commit on success, roll back on error, always close."""
    session = session_factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
