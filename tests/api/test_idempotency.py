"""Idempotency-Key on POST /v1/jobs: replay, mismatch, in flight, per user."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from sqlalchemy import select

from api.jobs.idempotency import fingerprint
from planner.spec import JobSpec
from store.base import utcnow
from store.db import session_scope
from store.models import IdempotencyKey, Job, User
from tests.api.conftest import Env, job_spec


def _post(env: Env, key: str, who: str = "alice", **overrides: object):  # noqa: ANN202
    return env.client.post("/v1/jobs", json=job_spec(**overrides),
                           headers={**env.auth(who), "Idempotency-Key": key})


def test_same_key_same_body_replays_the_response(env: Env) -> None:
    first = _post(env, "k-1")
    second = _post(env, "k-1")
    assert first.status_code == second.status_code == 201
    assert second.json() == first.json()
    assert second.headers["idempotent-replayed"] == "true"
    assert env.count(Job) == 1 and len(env.enqueued.calls) == 1


def test_same_key_other_body_is_422(env: Env) -> None:
    assert _post(env, "k-2").status_code == 201
    res = _post(env, "k-2", name="another")
    assert res.status_code == 422 and res.headers["content-type"] == "application/problem+json"
    assert res.json()["errors"][0]["field"] == "Idempotency-Key"
    assert env.count(Job) == 1


def test_key_still_in_flight_is_409(env: Env) -> None:
    spec = JobSpec.model_validate(job_spec())
    with session_scope(env.url) as session:
        user_id = session.scalar(select(User.id).where(User.name == "alice"))
        digest = fingerprint(spec.model_dump(mode="json", exclude_unset=True))
        session.add(IdempotencyKey(user_id=user_id, key="k-3", state="in_flight", request_hash=digest))
    # the request that claimed the key is alive: on Postgres it holds the claim's row lock until its
    # commit, whatever the claim's age (on SQLite a claim younger than ABANDONED_AFTER is live)
    with session_scope(env.url) as holder:
        if holder.get_bind().dialect.name == "postgresql":
            holder.execute(select(IdempotencyKey.key).where(IdempotencyKey.user_id == user_id,
                                                            IdempotencyKey.key == "k-3").with_for_update())
        res = _post(env, "k-3")
    assert res.status_code == 409 and res.headers["retry-after"]
    assert env.count(Job) == 0


def test_keys_are_per_user(env: Env) -> None:
    assert _post(env, "shared", "alice").status_code == 201
    assert _post(env, "shared", "bob", name="bob-job").status_code == 201
    assert env.count(Job) == 2


def test_failed_request_frees_the_key(env: Env) -> None:
    bad = _post(env, "k-4", model={"path": "big"}, method="full")
    assert bad.status_code == 422
    again = _post(env, "k-4", model={"path": "big"}, method="full")
    assert again.status_code == 422 and env.count(Job) == 0


def test_concurrent_same_key_makes_one_job(pg_env: Env) -> None:
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: _post(pg_env, "race"), range(6)))
    codes = sorted(r.status_code for r in results)
    assert set(codes) <= {201, 409} and 201 in codes
    assert pg_env.count(Job) == 1
    ids = {r.json()["id"] for r in results if r.status_code == 201}
    assert len(ids) == 1


def _claim(env: Env, key: str, age: timedelta) -> None:
    """A committed, unfinished claim of ``key`` by alice, as a request that died would leave it."""
    spec = JobSpec.model_validate(job_spec())
    with session_scope(env.url) as session:
        user_id = session.scalar(select(User.id).where(User.name == "alice"))
        digest = fingerprint(spec.model_dump(mode="json", exclude_unset=True))
        session.add(IdempotencyKey(user_id=user_id, key=key, state="in_flight", request_hash=digest,
                                   created_at=utcnow() - age))


def test_claim_of_a_dead_request_is_taken_over(env: Env) -> None:
    # on Postgres nobody holds the claim's lock: taken over at once; on SQLite after a while
    _claim(env, "orphan", timedelta(minutes=10) if env.url.startswith("sqlite") else timedelta(seconds=5))
    first = _post(env, "orphan")
    assert first.status_code == 201, first.text
    again = _post(env, "orphan")
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert env.count(Job) == 1


def test_claim_held_by_a_live_request_is_409_even_when_old(pg_env: Env) -> None:
    from sqlalchemy import create_engine

    _claim(pg_env, "live", timedelta(seconds=30))
    engine = create_engine(pg_env.url)
    try:
        with engine.connect() as holder:
            holder.begin()
            holder.execute(select(IdempotencyKey.key).where(IdempotencyKey.key == "live").with_for_update())
            res = _post(pg_env, "live")
            assert res.status_code == 409, res.text
        assert _post(pg_env, "live").status_code == 201  # the holder is gone: taken over
    finally:
        engine.dispose()
    assert pg_env.count(Job) == 1
