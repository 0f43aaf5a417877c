"""Token issue, revocation and lookup. Only a token's SHA-256 is stored; the token is shown once."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from store.base import utcnow
from store.ids import new_id
from store.models import ApiToken, User

TOKEN_PREFIX = "tb_"
DISPLAY_PREFIX_LEN = 11
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class Principal:
    """Who is calling: a plain value (not an ORM row), safe to cache across requests."""

    user_id: str
    name: str
    is_admin: bool
    token_id: str
    max_queued_jobs: int | None = None
    max_gpus: int | None = None


@dataclass(frozen=True)
class IssuedToken:
    user: Principal
    token: str  # the secret, shown once
    prefix: str


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def ensure_user(session: Session, name: str, *, admin: bool | None = None) -> User:
    """The user called ``name``, created if new; ``admin`` (when given) sets the admin flag."""
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        user = User(id=new_id("usr"), name=name, is_admin=bool(admin))
        session.add(user)
    elif admin is not None:
        user.is_admin = admin
    session.flush()
    return user


def create_token(session: Session, name: str, *, admin: bool | None = None) -> IssuedToken:
    user = ensure_user(session, name, admin=admin)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(id=new_id("tok"), user_id=user.id, token_hash=hash_token(secret),
                   prefix=secret[:DISPLAY_PREFIX_LEN])
    session.add(row)
    session.flush()
    return IssuedToken(user=Principal(user.id, user.name, user.is_admin, row.id), token=secret,
                       prefix=row.prefix)


class TokenNotFound(LookupError):
    pass


def revoke_token(session: Session, prefix_or_id: str) -> ApiToken:
    """Revoke the one live token with this display prefix (``tb_xxxxxxxx``) or id (``tok_...``)."""
    live = select(ApiToken).where(ApiToken.revoked_at.is_(None))
    if prefix_or_id.startswith("tok_"):
        rows = list(session.scalars(live.where(ApiToken.id == prefix_or_id)))
    else:
        rows = list(session.scalars(live.where(ApiToken.prefix.startswith(prefix_or_id, autoescape=True))))
    if len(rows) != 1:
        what = "no live token" if not rows else f"{len(rows)} live tokens"
        raise TokenNotFound(f"{what} match {prefix_or_id!r}")
    rows[0].revoked_at = utcnow()
    session.flush()
    return rows[0]


def lookup(session: Session, token: str) -> Principal | None:
    """The live token's user, or None. Marks the token used (at most once a minute, to spare writes)."""
    row = session.execute(
        select(ApiToken.id, ApiToken.last_used_at, User.id, User.name, User.is_admin, User.max_queued_jobs,
               User.max_gpus)
        .join(User, User.id == ApiToken.user_id)
        .where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
    ).first()
    if row is None:
        return None
    token_id, last_used, user_id, name, is_admin, max_queued, max_gpus = row
    now = utcnow()
    if last_used is None or now - last_used > LAST_USED_RESOLUTION:
        session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=now))
    return Principal(user_id, name, is_admin, token_id, max_queued, max_gpus)


class TokenCache:
    """Positive lookups kept ``ttl`` seconds: a revoked token stops working within that time.

    A token's lookups run one at a time (:meth:`look_up`): requests that miss while one is in
    flight wait for its answer, so an entry's expiry under load costs one query, not one per
    request in flight."""

    def __init__(self, ttl: float, max_entries: int = 10_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()
        self._in_flight: dict[str, asyncio.Future[Principal | None]] = {}

    async def look_up(self, token: str, look_up: Callable[[str], Awaitable[Principal | None]]
                      ) -> Principal | None:
        """``look_up(token)``, shared with the requests that ask for the same token meanwhile (on
        this event loop); a known token's principal is cached. A request cancelled while it waits
        leaves the lookup running for the others."""
        pending = self._in_flight.get(token)
        if pending is None or pending.get_loop() is not asyncio.get_running_loop():
            pending = asyncio.ensure_future(look_up(token))
            self._in_flight[token] = pending
            pending.add_done_callback(lambda done: self._settle(token, done))
        return await asyncio.shield(pending)

    def _settle(self, token: str, done: asyncio.Future[Principal | None]) -> None:
        if self._in_flight.get(token) is done:
            del self._in_flight[token]
        if not done.cancelled() and done.exception() is None and (principal := done.result()) is not None:
            self.put(token, principal)

    def get(self, token: str) -> Principal | None:
        if self.ttl <= 0:
            return None
        hit = self._entries.get(token)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def put(self, token: str, principal: Principal) -> None:
        if self.ttl <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[token] = (time.monotonic() + self.ttl, principal)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
