"""Bearer tokens: missing, unknown, revoked, other users, admins; hashed at rest."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import select

from api.auth.service import revoke_token
from store.db import session_scope
from store.models import ApiToken, JobEvent
from tests.api.conftest import Env, job_spec

ROUTES = [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/job_x"),
          ("POST", "/v1/jobs/job_x/cancel"), ("PATCH", "/v1/jobs/job_x"), ("GET", "/v1/jobs/job_x/events"),
          ("GET", "/v1/jobs/job_x/metrics"), ("GET", "/v1/jobs/job_x/checkpoints"), ("GET", "/v1/gpus"),
          ("POST", "/v1/plans"), ("GET", "/v1/datasets"), ("POST", "/v1/datasets"),
          ("GET", "/v1/datasets/ds_x")]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("header", [None, "Bearer tb_not-a-token", "Basic YWxpY2U6cHc=", "Bearer"])
def test_every_v1_route_needs_a_valid_token(pg_env: Env, method: str, path: str, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    body = job_spec() if method in ("POST", "PATCH") and "datasets" not in path else None
    res = pg_env.client.request(method, path, headers=headers, json=body)
    assert res.status_code == 401, res.text
    assert res.headers["content-type"] == "application/problem+json"
    assert res.headers["www-authenticate"].startswith("Bearer")
    assert res.json()["type"].endswith("/unauthorized")


def test_revoked_token_is_refused(env: Env) -> None:
    assert env.client.get("/v1/jobs", headers=env.auth("bob")).status_code == 200
    with session_scope(env.url) as session:
        revoke_token(session, env.tokens["bob"][:11])
    res = env.client.get("/v1/jobs", headers=env.auth("bob"))
    assert res.status_code == 401
    assert 'error="invalid_token"' in res.headers["www-authenticate"]


def test_tokens_are_stored_hashed(env: Env) -> None:
    with session_scope(env.url) as session:
        stored = session.scalars(select(ApiToken.token_hash)).all()
    assert hashlib.sha256(env.tokens["alice"].encode()).hexdigest() in stored
    assert env.tokens["alice"] not in stored


def test_only_owner_or_admin_cancels(env: Env) -> None:
    job = env.submit("alice")
    res = env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.auth("bob"))
    assert res.status_code == 403 and res.headers["content-type"] == "application/problem+json"
    assert env.client.get(f"/v1/jobs/{job['id']}", headers=env.auth()).json()["status"] == "queued"
    res = env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.auth("root"))
    assert res.status_code == 200 and res.json()["status"] == "cancelled"
    with session_scope(env.url) as session:
        audit = session.scalars(select(JobEvent).where(JobEvent.kind == "audit",
                                                       JobEvent.message == "cancel"))
        assert [e.actor for e in audit] == ["root"]


def test_priority_change_is_admin_only_and_audited(env: Env) -> None:
    job = env.submit("alice")
    res = env.client.patch(f"/v1/jobs/{job['id']}", json={"priority": 50}, headers=env.auth("alice"))
    assert res.status_code == 403
    res = env.client.patch(f"/v1/jobs/{job['id']}", json={"priority": 50}, headers=env.auth("root"))
    assert res.status_code == 200 and res.json()["priority"] == 50
    bad = env.client.patch(f"/v1/jobs/{job['id']}", json={"priority": 1000}, headers=env.auth("root"))
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "priority"
    with session_scope(env.url) as session:
        audit = session.scalars(select(JobEvent).where(JobEvent.message == "priority")).one()
        assert audit.actor == "root" and audit.data == {"action": "priority", "previous": 0, "priority": 50}


def test_token_cache_serves_a_revoked_token_only_briefly(pg_env: Env) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app

    app = create_app(pg_env.settings, enqueue=pg_env.enqueued, token_cache_ttl_s=60)
    with TestClient(app) as client:
        assert client.get("/v1/jobs", headers=pg_env.auth("bob")).status_code == 200
        with session_scope(pg_env.url) as session:
            revoke_token(session, pg_env.tokens["bob"][:11])
        assert client.get("/v1/jobs", headers=pg_env.auth("bob")).status_code == 200  # cached
        app.state.token_cache.clear()
        assert client.get("/v1/jobs", headers=pg_env.auth("bob")).status_code == 401
