"""``Idempotency-Key`` on ``POST /v1/jobs`` (IETF httpapi-idempotency-key-header semantics).

Same key and same body → the first response again (same status, no second job); same key and
another body → 422; same key while the first request is still running → 409. Keys are per user.

The claim on a key is committed before the job is created, in its own short transaction: a
concurrent request with the same key must see that the first is in flight. The job and the
stored response then commit together, so a replayed response always names a job that exists.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.errors import Conflict, FieldError, InvalidInput
from store.base import utcnow
from store.models import IdempotencyKey

HEADER = "Idempotency-Key"
# a claim older than this belongs to a request that died (process killed); it may be taken over
ABANDONED_AFTER = timedelta(minutes=5)


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
    """Claim ``key`` (committed at once) or return the stored response of the earlier request."""
    _check_key(key)
    row = session.get(IdempotencyKey, (user_id, key), with_for_update=True)
    if row is None:
        session.add(IdempotencyKey(user_id=user_id, key=key, request_hash=request_hash, state="in_flight"))
        try:
            session.commit()
        except IntegrityError:  # another request claimed it between our read and insert
            session.rollback()
            row = session.get(IdempotencyKey, (user_id, key))
            if row is None or (replay := _judge(row, key, request_hash)) is None:
                raise _in_flight(key) from None
            return replay
        return None
    replay = _judge(row, key, request_hash)
    if replay is None:  # an abandoned claim: take it over
        row.created_at = utcnow()
    session.commit()
    return replay


def _judge(row: IdempotencyKey, key: str, request_hash: str) -> StoredResponse | None:
    if row.request_hash != request_hash:
        raise InvalidInput(f"{HEADER} {key!r} was used with another request body",
                           errors=[FieldError(HEADER, "reused with a different body")])
    if row.state == "done" and row.response_status is not None and row.response_body is not None:
        return StoredResponse(row.response_status, row.response_body)
    if utcnow() - row.created_at < ABANDONED_AFTER:
        raise _in_flight(key)
    return None


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
