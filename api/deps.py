"""Dependencies shared by the routers, as ``Annotated`` aliases that raise typed errors.

``SessionDep`` is the request's unit of work: the session commits when the endpoint returns (before
the response is sent) and rolls back on an error; callbacks registered with :func:`after_commit`
(sending a Celery task) run only once the commit succeeded.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from api.auth.service import Principal, TokenCache, lookup
from api.errors import Forbidden, Unauthorized
from tunebox.settings import Settings

log = logging.getLogger(__name__)

_AFTER_COMMIT = "after_commit"


def get_settings(request: Request) -> Settings:
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
        await _end(session, _finish, inline=reads and not session.info.get(_AFTER_COMMIT))


async def _end(session: Session, how: Callable[[Session], None], *, inline: bool) -> None:
    # an autocommit session has nothing to commit or roll back: closing it only hands the
    # connection back to the pool (no I/O), cheaper here than a hop to a worker thread
    if inline:
        how(session)
    else:
        await run_in_threadpool(how, session)


# scope="function": commit when the endpoint returns, so the client never sees a 201 for a row
# that is not committed yet
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    session.info.setdefault(_AFTER_COMMIT, []).append(callback)


_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <token>`")
_CHALLENGE = 'Bearer realm="tunebox"'


async def get_principal(
    request: Request, session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("send `Authorization: Bearer <token>`", headers={"WWW-Authenticate": _CHALLENGE})
    token = credentials.credentials
    cache: TokenCache = request.app.state.token_cache
    principal = cache.get(token)
    if principal is None:
        principal = await run_in_threadpool(lookup, session, token)
        if principal is None:
            raise Unauthorized("the token is unknown or revoked",
                               headers={"WWW-Authenticate": _CHALLENGE + ', error="invalid_token"'})
        cache.put(token, principal)
    return principal


CurrentUser = Annotated[Principal, Depends(get_principal)]


async def require_admin(user: CurrentUser) -> Principal:
    if not user.is_admin:
        raise Forbidden("only an admin may do this")
    return user


AdminUser = Annotated[Principal, Depends(require_admin)]
