"""Dependencies shared by the routers, as ``Annotated`` aliases that raise typed errors.

``SessionDep`` is the request's unit of work: the session commits when the endpoint returns (before
the response is sent) and rolls back on an error; callbacks registered with :func:`after_commit`
(sending a Celery task) run only once the commit succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from functools import partial
from typing import Annotated, Any, Concatenate, ParamSpec, TypeVar

import anyio
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Executable, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from api.auth.service import Principal, TokenCache, lookup
from api.errors import Forbidden, Unauthorized
from tunebox.settings import Settings

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

_AFTER_COMMIT = "after_commit"
_DONE = "finished"


async def get_settings(request: Request) -> Settings:
    # async: FastAPI runs a plain function dependency in a worker thread, a hop for an attribute read
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_sessions(request: Request) -> sessionmaker[Session]:
    sessions: sessionmaker[Session] = request.app.state.sessions
    return sessions


def _finish(session: Session) -> None:
    try:
        session.commit()
    finally:
        session.close()
    for callback in session.info.pop(_AFTER_COMMIT, []):
        callback()


def finish_now(session: Session) -> None:
    """Commit and run the after-commit callbacks now, from the worker thread already doing the work.

    A handler that does all its blocking work in one thread ends it here, which spares the hop to
    another thread for the commit; the dependency then only has to let go of the session.
    """
    session.info[_DONE] = True
    _finish(session)


def _abort(session: Session) -> None:
    try:
        session.rollback()
    finally:
        session.close()


async def get_session(request: Request) -> AsyncIterator[Session]:
    # a Session does no I/O until first used, so it is made here; the commit (I/O) runs in a thread.
    # Reads (GET, HEAD) use the autocommit factory: nothing to commit, no BEGIN/COMMIT round trips.
    slots: anyio.Semaphore | None = request.app.state.db_slots  # see api.db.POOL_SIZE
    async with slots if slots is not None else contextlib.nullcontext():
        reads = request.method in ("GET", "HEAD")
        session = (request.app.state.read_sessions if reads else get_sessions(request))()
        try:
            yield session
        except BaseException:
            await _end(session, _abort, inline=reads)
            raise
        if session.info.pop(_DONE, False):
            return  # committed and closed by finish_now
        await _end(session, _finish, inline=reads and not session.info.get(_AFTER_COMMIT))


async def _end(session: Session, how: Callable[[Session], None], *, inline: bool) -> None:
    # an autocommit session has nothing to commit or roll back: closing it only hands the
    # connection back to the pool (no I/O), cheaper here than a hop to a worker thread
    if inline:
        how(session)
    else:
        await run_in_threadpool(how, session)


async def in_thread(executor: Executor | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in one of ``executor``'s threads, through asyncio's executor hand-off (about a
    third of the CPU of anyio's ``to_thread.run_sync``, the hop ``run_in_threadpool`` takes); in
    anyio's threads where ``executor`` is None (an app whose lifespan has not started).

    As with anyio's, a caller cancelled meanwhile still waits for ``fn`` to return, then raises
    ``CancelledError``: whatever ``fn`` uses (the request's session) is not let go under it.
    """
    if executor is None:
        return await run_in_threadpool(fn, *args)
    future = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(future)
            break
        except asyncio.CancelledError:
            if future.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


async def in_write_session(request: Request, fn: Callable[Concatenate[Session, P], T], *args: P.args,
                           **kwargs: P.kwargs) -> T:
    """``fn(session, ...)`` in a write session of its own, all of it in one worker thread
    (:func:`in_thread`): the unit of work ``SessionDep`` gives, without FastAPI's generator
    dependency (its exit stack and cancel scopes on the event loop). The session is admitted like
    any request session (see api.db.POOL_SIZE), committed when ``fn`` returns unless ``fn`` ended it
    (:func:`finish_now`), rolled back and closed when ``fn`` raises."""
    state = request.app.state
    slots: anyio.Semaphore | None = state.db_slots
    async with slots if slots is not None else contextlib.nullcontext():
        work = partial(_in_session, state.sessions(), fn, *args, **kwargs)
        return await in_thread(state.submit_threads, work)


def _in_session(session: Session, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        result = fn(session, *args, **kwargs)
    except BaseException:
        _abort(session)
        raise
    if not session.info.pop(_DONE, False):
        _finish(session)
    return result


# scope="function": commit when the endpoint returns, so the client never sees a 201 for a row
# that is not committed yet
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    session.info.setdefault(_AFTER_COMMIT, []).append(callback)


_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <token>`")
_CHALLENGE = 'Bearer realm="tunebox"'


def _token(credentials: HTTPAuthorizationCredentials | None) -> str:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("send `Authorization: Bearer <token>`", headers={"WWW-Authenticate": _CHALLENGE})
    return credentials.credentials


async def _caller(request: Request, credentials: HTTPAuthorizationCredentials | None,
                  look_up: Callable[[str], Awaitable[Principal | None]]) -> Principal:
    """The bearer token's principal: from the token cache, else ``look_up`` (then cached), one
    lookup of a token at a time."""
    token = _token(credentials)
    cache: TokenCache = request.app.state.token_cache
    principal = cache.get(token)
    if principal is None:
        principal = await cache.look_up(token, look_up)
        if principal is None:
            raise Unauthorized("the token is unknown or revoked",
                               headers={"WWW-Authenticate": _CHALLENGE + ', error="invalid_token"'})
    return principal


async def get_principal(
    request: Request, session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    return await _caller(request, credentials, lambda token: run_in_threadpool(lookup, session, token))


async def get_reader(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller, for read-only handlers that take no request session (see :func:`read_with`)."""
    return await _caller(request, credentials, lambda token: read_with(request, lookup, token))


async def read_with(request: Request, fn: Callable[Concatenate[Session, P], T], *args: P.args,
                    **kwargs: P.kwargs) -> T:
    """Run ``fn(session, ...)`` in an autocommit read session of its own.

    On Postgres the session is async and ``fn`` runs on the event loop (through greenlets); on
    SQLite it runs in a worker thread, admitted like any request session (see api.db.POOL_SIZE).
    """
    async_reads: async_sessionmaker[AsyncSession] | None = request.app.state.async_reads
    if async_reads is not None:
        async def read() -> T:
            async with async_reads() as session:
                return await session.run_sync(fn, *args, **kwargs)

        return await _again_if_stale(read)
    slots: anyio.Semaphore | None = request.app.state.db_slots
    async with slots if slots is not None else contextlib.nullcontext():
        sync_session = request.app.state.read_sessions()
        try:
            return await run_in_threadpool(fn, sync_session, *args, **kwargs)
        finally:
            sync_session.close()  # autocommit: nothing to end, only the connection to hand back


async def first_row(request: Request, statement: Executable, params: dict[str, Any]) -> Row[Any] | None:
    """The first row of one Core SELECT, read like :func:`read_with` but without an ORM session.

    On Postgres it runs on an async connection from the pool: no Session, no greenlet hop per
    call, which is most of what one small read costs in SQLAlchemy.
    """
    async_reads: async_sessionmaker[AsyncSession] | None = request.app.state.async_reads
    if async_reads is None:
        return await read_with(request, lambda session: session.execute(statement, params).first())
    engine: AsyncEngine = async_reads.kw["bind"]

    async def read() -> Row[Any] | None:
        async with engine.connect() as conn:
            return (await conn.execute(statement, params)).first()

    return await _again_if_stale(read)


async def _again_if_stale(read: Callable[[], Awaitable[T]]) -> T:
    """``read()``, once more where its pooled connection had died with its server (a database
    restart): SQLAlchemy has then dropped the pool's connections, and the second read gets a fresh
    one. The async read pool does not ping a connection before each read (a round trip a request)."""
    try:
        return await read()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
    return await read()


CurrentUser = Annotated[Principal, Depends(get_principal)]
# the same caller, looked up without the request's session (read-only handlers using read_with)
Reader = Annotated[Principal, Depends(get_reader)]


async def require_admin(user: CurrentUser) -> Principal:
    if not user.is_admin:
        raise Forbidden("only an admin may do this")
    return user


AdminUser = Annotated[Principal, Depends(require_admin)]
