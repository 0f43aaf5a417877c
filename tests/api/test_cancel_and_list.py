"""Cancel in each state; listing with cursor pagination and filters."""

from __future__ import annotations

import threading

from store.db import session_scope
from store.states import JobStatus, transition
from tests.api.conftest import Env


def _move(env: Env, job_id: str, *targets: JobStatus) -> None:
    with session_scope(env.url) as session:
        for target in targets:
            transition(session, job_id, target, actor="worker")


def test_cancel_queued_is_immediate(env: Env) -> None:
    job = env.submit()
    res = env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.auth())
    assert res.status_code == 200
    assert res.json()["status"] == "cancelled" and res.json()["finished_at"]


def test_cancel_running_asks_the_worker(env: Env) -> None:
    job = env.submit()
    _move(env, job["id"], JobStatus.STARTING, JobStatus.RUNNING)
    res = env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.auth())
    assert res.status_code == 202
    assert res.json()["status"] == "cancelling" and res.json()["cancel_requested_at"]
    again = env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.auth())
    assert again.status_code == 202 and again.json()["status"] == "cancelling"
    _move(env, job["id"], JobStatus.CANCELLED)
    assert env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.auth()).status_code == 409


def test_list_is_newest_first_and_filters(env: Env) -> None:
    a1, b1, a2 = env.submit("alice"), env.submit("bob"), env.submit("alice")
    env.client.post(f"/v1/jobs/{a1['id']}/cancel", headers=env.auth())
    everything = env.client.get("/v1/jobs", headers=env.auth()).json()
    assert [j["id"] for j in everything["items"]] == [a2["id"], b1["id"], a1["id"]]
    assert everything["next_after"] is None and "spec" not in everything["items"][0]
    mine = env.client.get("/v1/jobs?owner=me", headers=env.auth("bob")).json()["items"]
    assert [j["id"] for j in mine] == [b1["id"]]
    by_name = env.client.get("/v1/jobs?owner=alice&status=queued", headers=env.auth("bob")).json()["items"]
    assert [j["id"] for j in by_name] == [a2["id"]]
    several = env.client.get("/v1/jobs?status=queued&status=cancelled", headers=env.auth()).json()["items"]
    assert len(several) == 3
    assert env.client.get("/v1/jobs?owner=nobody", headers=env.auth()).json()["items"] == []


def test_the_model_filter_keeps_to_the_jobs_whose_details_the_caller_reads(env: Env) -> None:
    a1, b1, a2 = env.submit("alice"), env.submit("bob"), env.submit("alice")
    assert a1["model"] == "small"  # the model folder's name

    def ids(who: str, query: str) -> list[str]:
        return [j["id"] for j in env.client.get(f"/v1/jobs?{query}", headers=env.auth(who)).json()["items"]]

    assert ids("alice", "model=small") == [a2["id"], a1["id"]]  # bob's model is bob's to see
    assert ids("bob", "model=small") == [b1["id"]]
    assert ids("root", "model=small") == [a2["id"], b1["id"], a1["id"]]
    assert ids("root", "model=small&owner=bob") == [b1["id"]]
    assert ids("root", "model=big") == []


def test_pages_have_no_duplicates_or_gaps_while_jobs_arrive(pg_env: Env) -> None:
    env = pg_env
    before = {env.submit()["id"] for _ in range(23)}
    stop = threading.Event()
    arrived: list[str] = []

    def keep_submitting() -> None:
        while not stop.is_set():
            arrived.append(env.submit("bob")["id"])

    seen: list[str] = []
    writer = threading.Thread(target=keep_submitting)
    writer.start()
    try:
        after = None
        while True:
            params = {"limit": 5, **({"after": after} if after else {})}
            page = env.client.get("/v1/jobs", params=params, headers=env.auth()).json()
            seen.extend(j["id"] for j in page["items"])
            after = page["next_after"]
            if after is None:
                break
    finally:
        stop.set()
        writer.join()
    assert len(seen) == len(set(seen))  # no duplicates
    assert before <= set(seen)  # no gaps among the jobs that existed when paging began
    assert seen == sorted(seen, reverse=True)
    assert arrived  # jobs really arrived meanwhile


def test_the_queue_is_in_the_order_the_workers_start_jobs(env: Env) -> None:
    from store.db import session_scope
    from store.models import Job
    from worker.leasing import _queue_ahead_of

    low = env.submit("alice", priority=-5)
    first = env.submit("bob")
    urgent = env.submit("bob", priority=10)
    gone = env.submit("alice", priority=50)
    second = env.submit("alice")
    env.client.post(f"/v1/jobs/{gone['id']}/cancel", headers=env.auth())
    queue = env.client.get("/v1/queue", headers=env.auth("alice")).json()
    order = [j["id"] for j in queue["items"]]
    assert order == [urgent["id"], first["id"], second["id"], low["id"]] and queue["more"] == 0
    with session_scope(env.url) as s:  # the order a worker honours when it takes a job's GPUs
        last = s.get(Job, order[-1])
        assert [j.id for j in _queue_ahead_of(s, last)] == order
    theirs = queue["items"][0]
    assert theirs["owner"] == "bob" and theirs["model"] is None and theirs["progress"] is None
    page = env.client.get("/v1/queue?limit=2", headers=env.auth("bob")).json()
    assert [j["id"] for j in page["items"]] == order[:2] and page["more"] == 2
