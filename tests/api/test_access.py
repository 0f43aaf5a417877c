"""Who reads what, as a matrix over every private route: the owner and an admin read a job's
details and a dataset; another user gets the 404 of a resource that does not exist; no token is a
401. Everyone sees the queue. ``team_reads`` opens the details to the whole team."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from store.db import session_scope
from store.ids import new_id
from store.models import Checkpoint, Job, JobEvent, MetricPoint
from store.states import JobStatus, transition
from tests.api.conftest import Env, build_env, job_spec
from tests.tinydata import alpaca_rows

SSE = {"Accept": "text/event-stream"}


def _jsonl(n: int) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in alpaca_rows(n)).encode()


def _finished_job_with_details(env: Env) -> str:
    """Alice's job, ended, with a log event, a metric point and a checkpoint (each route has data)."""
    job_id = env.submit("alice")["id"]
    with session_scope(env.url) as session:
        transition(session, job_id, JobStatus.STARTING)
        transition(session, job_id, JobStatus.RUNNING, step=3, total_steps=10, loss=1.5)
        session.add(JobEvent(job_id=job_id, kind="log", message="/data/secret.jsonl loaded"))
        session.add(MetricPoint(job_id=job_id, kind="train", step=3, loss=1.5))
        session.add(Checkpoint(id=new_id("ckpt"), job_id=job_id, step=3, path="/x/ckpt-3"))
        transition(session, job_id, JobStatus.FAILED, failure_kind="user_error",
                   failure_reason="bad_dataset", failure_message="row 3 of /data/secret.jsonl")
    return job_id


def _job_routes(job_id: str) -> list[tuple[str, dict[str, str]]]:
    base = f"/v1/jobs/{job_id}"
    return [(base, {}), (f"{base}/events", {}), (f"{base}/events", SSE), (f"{base}/metrics", {}),
            (f"{base}/logs", {}), (f"{base}/logs?follow=true", {}),
            (f"{base}/metrics?kind=eval", {}), (f"{base}/checkpoints", {})]


def _submit_on(env: Env, who: str, dataset_id: str) -> httpx.Response:
    return env.client.post("/v1/jobs", json=job_spec(dataset={"id": dataset_id}), headers=env.auth(who))


def _listed(env: Env, who: str) -> list[str]:
    return [d["id"] for d in env.client.get("/v1/datasets", headers=env.auth(who)).json()["items"]]


def _status(env: Env, who: str | None, url: str, extra: dict[str, str]) -> int:
    headers = {**(env.auth(who) if who else {}), **extra}
    return env.client.get(url, headers=headers).status_code


@pytest.fixture
def team_env(pg_url: str, roots: tuple[Path, Path], tmp_path: Path) -> Iterator[Env]:
    yield from build_env(pg_url, roots, tmp_path, team_reads=True)


def test_job_details_are_the_owners_and_the_admins(pg_env: Env) -> None:
    job_id = _finished_job_with_details(pg_env)
    for url, extra in _job_routes(job_id):
        assert _status(pg_env, "alice", url, extra) == 200, url
        assert _status(pg_env, "root", url, extra) == 200, url
        assert _status(pg_env, None, url, extra) == 401, url
        hidden = pg_env.client.get(url, headers={**pg_env.auth("bob"), **extra})
        unknown = pg_env.client.get(url.replace(job_id, "job_nosuchjob"), headers=pg_env.auth("bob"))
        assert hidden.status_code == 404, url
        assert hidden.json()["errors"] == unknown.json()["errors"], url  # nothing tells them apart
        assert "secret" not in hidden.text


def test_everyone_sees_the_queue_without_anothers_progress_or_failure(pg_env: Env) -> None:
    job_id = _finished_job_with_details(pg_env)
    [mine] = pg_env.client.get("/v1/jobs", headers=pg_env.auth("alice")).json()["items"]
    [theirs] = pg_env.client.get("/v1/jobs", headers=pg_env.auth("bob")).json()["items"]
    [admins] = pg_env.client.get("/v1/jobs", headers=pg_env.auth("root")).json()["items"]
    assert mine == admins
    assert mine["progress"]["step"] == 3 and mine["failure"]["reason"] == "bad_dataset"
    queue = ("id", "name", "owner", "status", "num_gpus", "priority", "created_at", "started_at",
             "finished_at")
    assert {k: theirs[k] for k in queue} == {k: mine[k] for k in queue}
    assert theirs["id"] == job_id and theirs["owner"] == "alice" and theirs["status"] == "failed"
    assert theirs["progress"] is None and theirs["failure"] is None
    assert mine["model"] == "small" and theirs["model"] is None
    by_owner = pg_env.client.get("/v1/jobs?owner=alice", headers=pg_env.auth("bob")).json()["items"]
    assert [j["id"] for j in by_owner] == [job_id]


def test_another_user_cannot_cancel_but_sees_the_reason(pg_env: Env) -> None:
    job_id = pg_env.submit("alice")["id"]
    res = pg_env.client.post(f"/v1/jobs/{job_id}/cancel", headers=pg_env.auth("bob"))
    assert res.status_code == 403  # the job is in the queue they see; cancelling it is not theirs
    assert pg_env.client.post(f"/v1/jobs/{job_id}/cancel", headers=pg_env.auth("root")).status_code == 200


def test_datasets_are_listed_read_and_trained_on_by_their_owner_and_admins(pg_env: Env) -> None:
    ds = pg_env.client.post("/v1/datasets", content=_jsonl(5), headers=pg_env.auth("alice")).json()
    bobs = pg_env.client.post("/v1/datasets", content=_jsonl(3), headers=pg_env.auth("bob")).json()
    assert _listed(pg_env, "alice") == [ds["id"]] and _listed(pg_env, "bob") == [bobs["id"]]
    assert _listed(pg_env, "root") == [bobs["id"], ds["id"]]
    url = f"/v1/datasets/{ds['id']}"
    assert _status(pg_env, "alice", url, {}) == 200 and _status(pg_env, "root", url, {}) == 200
    assert _status(pg_env, None, url, {}) == 401
    hidden = pg_env.client.get(url, headers=pg_env.auth("bob"))
    assert hidden.status_code == 404
    assert hidden.json()["errors"] == [{"field": "dataset_id", "message": "no such dataset"}]

    refused = _submit_on(pg_env, "bob", ds["id"])
    assert refused.status_code == 422
    assert [e["field"] for e in refused.json()["errors"]] == ["dataset.id"]
    unknown = _submit_on(pg_env, "bob", "ds_nothing")
    assert refused.json()["errors"][0]["message"] == unknown.json()["errors"][0]["message"].replace(
        "ds_nothing", ds["id"])
    assert pg_env.count(Job) == 0
    for who in ("alice", "root"):
        res = _submit_on(pg_env, who, ds["id"])
        assert res.status_code == 201, res.text
    assert pg_env.count(Job) == 2


def test_team_reads_opens_the_details_and_datasets_to_everyone(team_env: Env) -> None:
    job_id = _finished_job_with_details(team_env)
    for url, extra in _job_routes(job_id):
        assert _status(team_env, "bob", url, extra) == 200, url
        assert _status(team_env, None, url, extra) == 401, url
    [theirs] = team_env.client.get("/v1/jobs", headers=team_env.auth("bob")).json()["items"]
    assert theirs["progress"]["step"] == 3
    ds = team_env.client.post("/v1/datasets", content=_jsonl(5), headers=team_env.auth("alice")).json()
    assert _status(team_env, "bob", f"/v1/datasets/{ds['id']}", {}) == 200
    assert _listed(team_env, "bob") == [ds["id"]]
    res = _submit_on(team_env, "bob", ds["id"])
    assert res.status_code == 201, res.text
