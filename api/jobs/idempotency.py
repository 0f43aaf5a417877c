"""``Idempotency-Key`` on ``POST /v1/jobs`` (IETF httpapi-idempotency-key-header semantics).

Same key and same body → the first response again (same status, no second job); same key and
another body → 422; same key while the first request is still running → 409. Keys are per user.

The claim on a key is committed before the job is created, in its own short transaction, so a
concurrent request with the same key sees that the first is in flight; the job and the stored
response then commit together, so a replayed response always names a job that exists.

A claim whose request died (its process killed between the two commits) must not block the key.
On Postgres the live request holds a row lock on its claim until it commits; a claim nobody holds
is abandoned and the next request with the key takes it over at once. SQLite (one process, the
embedded default) has no row locks, so there an unfinished claim is taken over after a while.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from api.errors import Conflict, FieldError, InvalidInput
from store.base import utcnow
from store.models import IdempotencyKey

HEADER = "Idempotency-Key"
# between committing its claim and locking it a live request holds no lock: a claim this young is
# taken as live without looking at the lock
CLAIM_GRACE = timedelta(seconds=2)
# without row locks (SQLite): an unfinished claim older than this belongs to a dead request
ABANDONED_AFTER = timedelta(minutes=5)
LOCK_NOT_AVAILABLE = "55P03"


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: dict[str, Any]


def fingerprint(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _check_key(key: str) -> None:
    if not key or len(key) > 255 or not key.isprintable():
        raise InvalidInput.for_field(HEADER, "must be 1-255 printable characters")


def claim(session: Session, user_id: str, key: str, request_hash: str) -> StoredResponse | None:
    """Claim ``key`` or return the stored response of the earlier request with it.

    On return (None) the claim is committed and this request holds it for the rest of its
    transaction. Raises 422 for another body with the same key, 409 while that request is live.
    """
    _check_key(key)
    row = session.get(IdempotencyKey, (user_id, key))
    if row is None:
        session.add(IdempotencyKey(user_id=user_id, key=key, request_hash=request_hash, state="in_flight"))
        try:
            session.commit()
        except IntegrityError:  # another request claimed it between our read and insert
            session.rollback()
            raise _in_flight(key) from None
        _hold(session, user_id, key)
        return None
    if row.request_hash != request_hash:
        raise InvalidInput(f"{HEADER} {key!r} was used with another request body",
                           errors=[FieldError(HEADER, "reused with a different body")])
    if row.state == "done" and row.response_status is not None and row.response_body is not None:
        return StoredResponse(row.response_status, row.response_body)
    if not _abandoned(session, row):
        raise _in_flight(key)
    row.created_at = utcnow()  # taken over; the lock taken in _abandoned is held until the commit
    session.flush()
    return None


def _hold(session: Session, user_id: str, key: str) -> None:
    session.execute(select(IdempotencyKey.key).where(IdempotencyKey.user_id == user_id,
                                                     IdempotencyKey.key == key).with_for_update())


def _abandoned(session: Session, row: IdempotencyKey) -> bool:
    """Whether the request that claimed ``row`` is gone; on Postgres, locks the claim if so."""
    age = utcnow() - row.created_at
    if session.get_bind().dialect.name != "postgresql":
        return age > ABANDONED_AFTER
    if age < CLAIM_GRACE:
        return False
    try:
        session.execute(select(IdempotencyKey.key)
                        .where(IdempotencyKey.user_id == row.user_id, IdempotencyKey.key == row.key)
                        .with_for_update(nowait=True))
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        session.rollback()
        return False  # the claimer is alive and holds its lock
    return True


def _in_flight(key: str) -> Conflict:
    return Conflict(f"a request with {HEADER} {key!r} is still being processed; retry later",
                    errors=[FieldError(HEADER, "request in flight")], headers={"Retry-After": "1"})


def complete(session: Session, user_id: str, key: str, status: int, body: dict[str, Any],
             job_id: str | None) -> None:
    """Store the response in the request's transaction (it commits with the job)."""
    row = session.get(IdempotencyKey, (user_id, key))
    assert row is not None, "complete() without claim()"
    row.state, row.response_status, row.response_body, row.job_id = "done", status, body, job_id
    session.flush()


def release(session: Session, user_id: str, key: str) -> None:
    """After a failed request: roll back its work and free the key, so a retry runs afresh."""
    session.rollback()
    session.execute(delete(IdempotencyKey).where(IdempotencyKey.user_id == user_id,
                                                 IdempotencyKey.key == key,
                                                 IdempotencyKey.state == "in_flight"))
    session.commit()
