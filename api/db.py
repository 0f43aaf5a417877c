"""The API's database handles: a session factory for writes and one in autocommit for reads.

A GET runs its one or two SELECTs in autocommit: no BEGIN/COMMIT round trips for a request that
writes nothing. Connections are pinged on checkout: one short round trip per request buys that,
once a restarted database is back, no request fails on a connection the restart left stale.

On Postgres the hottest reads (one job, the token lookup) also have an asyncio engine (psycopg's
async connections): they run on the event loop, without handing the GIL to a worker thread and
back for every query. Its pool belongs to one event loop, so the app opens it at startup and
closes it at shutdown (:func:`open_async_reads`); SQLite keeps the threaded path.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from store.db import make_engine

# Requests holding a session at once, per process. A session keeps its connection from the
# handler's thread to the commit's thread; with more sessions than connections, handlers waiting
# for a connection could hold every thread while the sessions that own the connections wait for
# a thread to commit in. Admitting at most POOL_SIZE sessions makes that wait impossible.
POOL_SIZE = 12
# Threads for blocking work: a few are enough on a small box, and fewer runnable threads contend
# less for the GIL than anyio's default of 40.
THREADS = 8
# Threads a process runs submissions in (api.deps.in_thread). A submission is mostly CPU under one
# GIL, with a few database round trips: three keep the process busy while one waits, and fewer
# threads handing the GIL to each other cost less CPU (docs/benchmarks.md, fifth round).
SUBMIT_THREADS = 3


@dataclass(frozen=True)
class ApiDatabase:
    engine: Engine
    sessions: sessionmaker[Session]
    reads: sessionmaker[Session]
    slots: int = POOL_SIZE

    def dispose(self) -> None:
        self.engine.dispose()


def open_database(url: str) -> ApiDatabase:
    extra = {} if url.startswith("sqlite") else {"pool_size": POOL_SIZE, "max_overflow": 0}
    engine = make_engine(url, **extra)
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    return ApiDatabase(engine=engine, sessions=sessionmaker(bind=engine, expire_on_commit=False),
                       reads=sessionmaker(bind=autocommit, expire_on_commit=False))


def open_async_reads(url: str) -> async_sessionmaker[AsyncSession] | None:
    """Autocommit async sessions for reads on Postgres; None for other databases (threaded path)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return None
    # no ping on checkout: a read whose connection turns out dead runs again (api.deps._again_if_stale)
    engine = create_async_engine(parsed.set(drivername="postgresql+psycopg"), pool_size=POOL_SIZE,
                                 max_overflow=0, isolation_level="AUTOCOMMIT")
    return async_sessionmaker(bind=engine, expire_on_commit=False)


async def close_async_reads(reads: async_sessionmaker[AsyncSession] | None) -> None:
    if reads is not None:
        await reads.kw["bind"].dispose()
