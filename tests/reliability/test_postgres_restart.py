"""Fault 4: Postgres goes down and comes back while clients submit and poll.

A throwaway cluster of our own (the shared server on :5432 is never touched) is stopped and started
under a real ``tunebox serve``. While it is down the API answers 503 problem+json (never a 500,
never a hang); once it is back the API recovers by itself; every job a client was told about
exists, and every job row is whole: spec, plan and its 'created' event, none half-written. Clients
retry a failed submission with the same Idempotency-Key, as a careful client does, and each of
their submissions ends as exactly one job.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, update

from store.db import session_scope
from store.models import Job, JobEvent
from tests.reliability.conftest import _overrides
from tests.reliability.support import (
    TERMINAL,
    PgCluster,
    RedisServer,
    Stack,
    job,
    lora_spec,
    progress,
    submit,
)
from tests.worker.conftest import migrate
from tests.worker.harness import wait_for, wait_job

pytestmark = pytest.mark.slow
CLIENTS = 6
OUTAGE_S = 4.0
RECOVERY_S = 5.0


@dataclass
class Seen:
    """What the clients saw: (time, operation, status, content type, body) per response."""

    responses: list[tuple[float, str, int, str, dict[str, Any]]] = field(default_factory=list)
    errors: list[tuple[float, str, str]] = field(default_factory=list)
    submissions: dict[str, str | None] = field(default_factory=dict)  # key -> job id once 201
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, op: str, res: httpx.Response) -> None:
        body = res.json() if res.headers.get("content-type", "").endswith("json") else {}
        with self.lock:
            self.responses.append((time.monotonic(), op, res.status_code, res.headers.get("content-type", ""),
                                   body if isinstance(body, dict) else {}))


@pytest.fixture(scope="module")
def pg_stack(roots: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, PgCluster]]:
    base = tmp_path_factory.mktemp("pg-stack")
    cluster = PgCluster().init()
    redis = RedisServer(base / "redis").start()
    try:
        migrate(cluster.url)
        overrides = _overrides(roots, submit_rate_per_minute=100_000, max_queued_jobs_per_user=100_000,
                               train_module="tests.worker.fake_train", eval_module="tests.worker.fake_eval")
        stack = Stack(cluster.url, redis.url, base / "data", base, overrides, redis=redis)
        stack.start_api()
        yield stack, cluster
        stack.stop()
    finally:
        redis.stop()
        cluster.remove()


def _client_loop(stack: Stack, token: str, stop: threading.Event, seen: Seen) -> None:
    assert stack.api is not None
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=stack.api.base_url, headers=headers, timeout=30) as client:
        while not stop.is_set():
            key = f"k-{secrets.token_hex(8)}"
            with seen.lock:
                seen.submissions[key] = None
            job_id = _submit_until_accepted(client, key, stop, seen)
            for _ in range(3):
                if job_id is not None:
                    _call(client, "get", f"/v1/jobs/{job_id}", seen)
                _call(client, "list", "/v1/jobs?limit=5", seen)


def _call(client: httpx.Client, op: str, path: str, seen: Seen, **kwargs: Any) -> httpx.Response | None:
    try:
        res = client.request("POST" if op == "submit" else "GET", path, **kwargs)
    except httpx.HTTPError as exc:
        with seen.lock:
            seen.errors.append((time.monotonic(), op, repr(exc)))
        return None
    seen.record(op, res)
    return res


def _submit_until_accepted(client: httpx.Client, key: str, stop: threading.Event, seen: Seen) -> str | None:
    body = {**lora_spec("fake:ok", max_steps=3, save_steps=5), "name": key}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        res = _call(client, "submit", "/v1/jobs", seen, json=body, headers={"Idempotency-Key": key})
        if res is not None and res.status_code == 201:
            job_id = str(res.json()["id"])
            with seen.lock:
                seen.submissions[key] = job_id
            return job_id
        if stop.is_set() and (res is None or res.status_code not in (503, 409)):
            return None
        time.sleep(0.2)
    return None


def test_postgres_restart_answers_503_then_recovers_with_no_half_written_job(
        pg_stack: tuple[Stack, PgCluster]) -> None:
    stack, cluster = pg_stack
    assert stack.api is not None
    stop, seen = threading.Event(), Seen()
    threads = [threading.Thread(target=_client_loop, args=(stack, stack.api.token, stop, seen))
               for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    cluster.stop("fast")  # returns once the server is down (pg_ctl -w): the outage starts here
    down_at = time.monotonic()
    time.sleep(OUTAGE_S)
    restart_at = time.monotonic()  # the server accepts connections before pg_ctl -w start returns
    cluster.start()
    up_at = time.monotonic()
    time.sleep(RECOVERY_S + 4.0)
    stop.set()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads)

    assert not seen.errors, seen.errors[:5]  # the API itself stayed up and answered every request
    statuses = {status for _, _, status, _, _ in seen.responses}
    assert statuses <= {200, 201, 409, 503}, statuses
    outage = [r for r in seen.responses if down_at + 0.5 < r[0] < restart_at]
    assert outage and all(status == 503 for _, _, status, _, _ in outage), {r[2] for r in outage}
    for _, _, status, ctype, body in seen.responses:
        if status >= 400:
            assert ctype == "application/problem+json" and body["status"] == status, body
    recovered = [r for r in seen.responses if r[0] > up_at + RECOVERY_S]
    assert recovered and all(status in (200, 201) for _, _, status, _, _ in recovered), \
        sorted({(op, status) for _, op, status, _, _ in recovered})

    # every submission a client made became exactly one job, and every job is whole
    accepted = {key: job_id for key, job_id in seen.submissions.items() if job_id is not None}
    unfinished = [key for key, job_id in seen.submissions.items() if job_id is None]
    assert len(unfinished) <= CLIENTS  # at most the one each client had going when told to stop
    with session_scope(stack.db_url) as s:
        rows = {j.name: j for j in s.scalars(select(Job))}
        created = dict(s.execute(select(JobEvent.job_id, func.count()).where(JobEvent.kind == "created")
                                 .group_by(JobEvent.job_id)).all())
        for j in rows.values():
            s.expunge(j)
    for key, job_id in accepted.items():
        assert rows[key].id == job_id
    assert set(rows) <= set(seen.submissions), "a job no client submitted"
    for j in rows.values():
        assert j.spec and j.plan and j.plan.get("deepspeed_config") and j.planned_peak_gpu_bytes
        assert created.get(j.id) == 1, j.id
    assert len(accepted) > 20


def test_a_running_job_rides_out_a_postgres_restart(pg_stack: tuple[Stack, PgCluster]) -> None:
    """The worker keeps the training going through a short outage and loses none of its records."""
    stack, cluster = pg_stack
    with session_scope(stack.db_url) as s:  # the jobs the clients above left queued are not this test's
        s.execute(update(Job).where(Job.status == "queued").values(status="cancelled"))
    stack.start_worker()
    try:
        with stack.client() as client:
            job_id = submit(client, lora_spec("fake:ok", max_steps=80, save_steps=10))
            wait_for(lambda: (job(stack.db_url, job_id).step or 0) >= 12, 60, "the run past a checkpoint")
            cluster.stop("fast")
            time.sleep(OUTAGE_S)
            cluster.start()
            done = wait_job(client, job_id, TERMINAL, 60, *stack.workers)
            # the API's first use of a connection from before the restart may still answer 503
            url = f"/v1/jobs/{job_id}/checkpoints"
            res = wait_for(lambda: (r := client.get(url)).status_code == 200 and r, 10, "the checkpoints")
            listed = res.json()["items"]
    finally:
        stack.stop_workers()
    assert (done["status"], done["attempt"]) == ("succeeded", 1), done.get("failure")
    assert done["progress"]["step"] == 80
    assert [c["step"] for c in listed] == list(range(10, 81, 10))  # none lost in the outage
    assert [c["step"] for c in listed if c["is_final"]] == [80]
    assert [r["type"] for r in progress(stack.job_dir(job_id))].count("start") == 1


def test_the_first_read_after_a_restart_answers_from_a_fresh_connection(
        pg_stack: tuple[Stack, PgCluster]) -> None:
    """The API's read pool does not ping a connection before each read: a read that finds its pooled
    connection dead with the old server runs again on a new one, so the client never sees it."""
    stack, cluster = pg_stack
    with stack.client() as client:
        job_id = submit(client, lora_spec("fake:ok", max_steps=3, save_steps=5))
        for _ in range(3):  # the pool now holds connections to this server
            assert client.get(f"/v1/jobs/{job_id}").status_code == 200
        cluster.stop("fast")
        cluster.start()
        first = client.get(f"/v1/jobs/{job_id}")
        assert first.status_code == 200, first.text
        assert client.get("/v1/jobs?limit=5").status_code == 200
