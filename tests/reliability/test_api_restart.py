"""Fault 3: the API process dies during ``POST /v1/jobs`` with an ``Idempotency-Key``.

Made deterministic: the API's broker is a server that never answers, so the request hangs in the
send that follows the commit (the job and its stored response are committed, no response has gone
out). The API is SIGKILLed there and started again; the client's retry with the same key and body
gets the same job, and there is one row. The job was never sent to the broker: a worker's
reconciler finds it queued with no message and it runs.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from store.db import session_scope
from store.models import Job
from tests.reliability.support import TERMINAL, BlackHole, Stack, events, lora_spec
from tests.worker.harness import ApiServer, wait_for, wait_job

pytestmark = pytest.mark.slow


def _rows_named(db_url: str, name: str) -> list[str]:
    with session_scope(db_url) as s:
        return list(s.scalars(select(Job.id).where(Job.name == name)))


def _post(base_url: str, token: str, key: str, body: dict[str, Any], out: dict[str, Any]) -> None:
    try:
        out["response"] = httpx.post(f"{base_url}/v1/jobs", json=body, timeout=120,
                                     headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key})
    except httpx.HTTPError as exc:
        out["error"] = exc


def test_retry_after_the_api_died_between_commit_and_response_returns_the_same_job(
        fake_stack: Stack) -> None:
    stack = fake_stack
    name, key = f"fake:ok-{secrets.token_hex(3)}", f"key-{secrets.token_hex(8)}"
    body = {**lora_spec("fake:ok", max_steps=3, save_steps=5), "name": name}
    hole = BlackHole().start()
    api = ApiServer(stack.env(broker_url=hole.url), stack.logs / "api-hanging-broker.log").start()
    first: dict[str, Any] = {}
    sender = threading.Thread(target=_post, args=(api.base_url, api.token, key, body, first))
    try:
        sender.start()
        wait_for(lambda: _rows_named(stack.db_url, name), 30, "the job's commit")
        wait_for(lambda: hole.conns, 10, "the API's send to the broker")
        assert sender.is_alive() and not first  # committed, and no response yet
        assert api.proc is not None
        api.proc.kill()
        api.proc.wait()
        sender.join(30)
    finally:
        hole.close()
    assert "error" in first and "response" not in first

    restarted = ApiServer(stack.env(), stack.logs / "api-restarted.log").start()
    try:
        retry = httpx.post(f"{restarted.base_url}/v1/jobs", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": key})
        assert retry.status_code == 201, retry.text
        assert retry.headers.get("idempotent-replayed") == "true"
        job_id = retry.json()["id"]
        assert _rows_named(stack.db_url, name) == [job_id]
        again = httpx.post(f"{restarted.base_url}/v1/jobs", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": key})
        assert again.json()["id"] == job_id and _rows_named(stack.db_url, name) == [job_id]

        stack.stop_workers()
        stack.start_worker(requeue_after_s=1)
        with restarted.client() as client:
            done = wait_job(client, job_id, TERMINAL, 60, *stack.workers)
    finally:
        restarted.stop()
        stack.stop_workers()
        stack.start_worker()
    assert done["status"] == "succeeded"
    assert "the job's message was not on the broker; sent again" in [
        e.message for e in events(stack.db_url, job_id, "reconcile")]
    with session_scope(stack.db_url) as s:
        assert s.scalar(select(func.count()).select_from(Job).where(Job.name == name)) == 1


def _claim_state(db_url: str, key: str) -> str | None:
    from store.models import IdempotencyKey

    with session_scope(db_url) as s:
        return s.scalar(select(IdempotencyKey.state).where(IdempotencyKey.key == key))


def test_retry_after_the_api_died_before_the_commit_makes_the_job_once(fake_stack: Stack) -> None:
    """Killed after its claim on the key was committed but before the job was: the key is not stuck."""
    from sqlalchemy import create_engine, text

    stack = fake_stack
    name, key = f"fake:ok-{secrets.token_hex(3)}", f"key-{secrets.token_hex(8)}"
    body = {**lora_spec("fake:ok", max_steps=3, save_steps=5), "name": name}
    api = ApiServer(stack.env(), stack.logs / "api-killed-before-commit.log").start()
    first: dict[str, Any] = {}
    sender = threading.Thread(target=_post, args=(api.base_url, api.token, key, body, first))
    blocker = create_engine(stack.db_url).connect()
    try:
        blocker.begin()
        blocker.execute(text("LOCK TABLE jobs IN SHARE MODE"))  # the job's INSERT waits; reads do not
        sender.start()
        wait_for(lambda: _claim_state(stack.db_url, key) == "in_flight", 30, "the committed claim")
        time.sleep(0.5)
        assert sender.is_alive() and not first and not _rows_named(stack.db_url, name)
        assert api.proc is not None
        api.proc.kill()
        api.proc.wait()
    finally:
        blocker.rollback()
        blocker.close()
    sender.join(30)
    assert "error" in first

    restarted = ApiServer(stack.env(), stack.logs / "api-restarted-2.log").start()
    try:
        retry = httpx.post(f"{restarted.base_url}/v1/jobs", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": key})
        replay = httpx.post(f"{restarted.base_url}/v1/jobs", json=body, timeout=30,
                            headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": key})
    finally:
        restarted.stop()
    assert retry.status_code == 201, retry.text
    assert replay.status_code == 201 and replay.json()["id"] == retry.json()["id"]
    assert _rows_named(stack.db_url, name) == [retry.json()["id"]]
