"""Health, readiness, Prometheus metrics, OpenAPI; GPU inventory; plans; per-user limits."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from api.app import create_app
from store.models import Job
from tests.api.conftest import BOX, Env, build_env, job_spec, report_gpus


def test_healthz_and_readyz(env: Env) -> None:
    assert env.client.get("/healthz").json() == {"status": "ok"}
    res = env.client.get("/readyz")
    assert res.status_code == 200, res.text


def test_readyz_waits_for_a_worker_and_a_job_queued_without_one_says_so(
        pg_url: str, roots: tuple[Path, Path], tmp_path: Path) -> None:
    for env in build_env(pg_url, roots, tmp_path, worker=False, inventory_interval_s=1.0):
        res = env.client.get("/readyz")
        assert res.status_code == 503 and [e["field"] for e in res.json()["errors"]] == ["worker"]
        assert "no worker has reported yet" in res.json()["errors"][0]["message"]
        job = env.submit()  # accepted: it waits in the queue
        events = env.client.get(f"/v1/jobs/{job['id']}/events", headers=env.auth()).json()["items"]
        waiting = [e for e in events if e["kind"] == "waiting"]
        assert len(waiting) == 1 and "tunebox worker" in waiting[0]["message"]

        report_gpus(env.url, env.settings)  # a worker's housekeeping refreshes the box's GPUs
        assert env.client.get("/readyz").json()["worker"] == "ok"
        second = env.submit()
        events = env.client.get(f"/v1/jobs/{second['id']}/events", headers=env.auth()).json()["items"]
        assert [e for e in events if e["kind"] == "waiting"] == []

        time.sleep(3.2)  # three refreshes missed: the worker counts as gone
        res = env.client.get("/readyz")
        assert res.status_code == 503 and "no worker has reported since" in res.json()["errors"][0]["message"]


def test_readyz_is_503_problem_when_the_broker_is_down(pg_url: str, roots: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    for env in build_env(pg_url, roots, tmp_path, broker_url="redis://127.0.0.1:1/0"):
        res = env.client.get("/readyz")
        assert res.status_code == 503 and res.headers["content-type"] == "application/problem+json"
        assert [e["field"] for e in res.json()["errors"]] == ["broker"]


def test_readyz_is_503_when_the_database_is_unreachable(roots: tuple[Path, Path], tmp_path: Path) -> None:
    from tests.api.conftest import make_settings

    settings = make_settings("postgresql+psycopg://postgres@127.0.0.1:1/none", roots, tmp_path)
    with TestClient(create_app(settings, enqueue=lambda *a, **k: "t")) as client:
        res = client.get("/readyz")
        api = client.get("/v1/jobs", headers={"Authorization": "Bearer tb_x"})
    assert res.status_code == 503 and "database" in [e["field"] for e in res.json()["errors"]]
    assert api.status_code == 503 and api.headers["content-type"] == "application/problem+json"
    assert api.headers["retry-after"]


def test_prometheus_metrics(env: Env) -> None:
    env.submit()
    env.client.get("/v1/jobs", headers=env.auth())
    text = env.client.get("/metrics").text
    assert 'tunebox_jobs{status="queued"} 1.0' in text
    assert 'tunebox_http_requests_total{method="POST",route="/v1/jobs",status="201"} 1.0' in text
    assert 'tunebox_http_request_duration_seconds_count{method="GET",route="/v1/jobs"}' in text


def test_openapi_lists_the_surface(env: Env) -> None:
    document = env.client.get("/openapi.json").json()
    paths = document["paths"]
    assert "Problem" in document["components"]["schemas"]
    errors = [r for ops in paths.values() for op in ops.values() for code, r in op["responses"].items()
              if code[0] in "45"]
    assert errors and all(list(r["content"]) == ["application/problem+json"] for r in errors)
    for path in ("/v1/plans", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel",
                 "/v1/jobs/{job_id}/events", "/v1/jobs/{job_id}/metrics", "/v1/jobs/{job_id}/checkpoints",
                 "/v1/gpus", "/v1/datasets", "/healthz", "/readyz", "/metrics"):
        assert path in paths


def test_gpus_inventory_from_settings_stand_ins(env: Env) -> None:
    items = env.client.get("/v1/gpus", headers=env.auth()).json()["items"]
    assert len(items) == BOX["gpu_count"]
    assert items[0]["memory_total_bytes"] == BOX["gpu_memory_bytes"] and items[0]["healthy"] is True


def test_plan_on_the_box_and_on_given_hardware(env: Env) -> None:
    res = env.client.post("/v1/plans", json=job_spec(), headers=env.auth())
    assert res.status_code == 200, res.text
    assert res.json()["fits"] is True
    what_if = job_spec(model={"path": "big"}, method="full", hardware=BOX)
    res = env.client.post("/v1/plans", json=what_if, headers=env.auth())
    assert res.status_code == 200 and res.json()["fits"] is False
    assert env.count(Job) == 0
    res = env.client.post("/v1/plans", json=job_spec(model={"path": "../x"}), headers=env.auth())
    assert res.status_code == 422 and res.json()["errors"][0]["field"] == "model.path"


def test_queued_jobs_limit_is_429(pg_url: str, roots: tuple[Path, Path], tmp_path: Path) -> None:
    for env in build_env(pg_url, roots, tmp_path, max_queued_jobs_per_user=2):
        env.submit()
        env.submit()
        res = env.client.post("/v1/jobs", json=job_spec(), headers=env.auth())
        assert res.status_code == 429 and res.headers["content-type"] == "application/problem+json"
        assert env.count(Job) == 2
        env.submit("bob")  # another user's quota is their own


def test_submission_rate_limit_is_429_with_retry_after(pg_url: str, roots: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    for env in build_env(pg_url, roots, tmp_path, submit_rate_per_minute=3):
        codes = [env.client.post("/v1/jobs", json=job_spec(), headers=env.auth()).status_code
                 for _ in range(4)]
        assert codes == [201, 201, 201, 429]
        res = env.client.post("/v1/jobs", json=job_spec(), headers=env.auth())
        assert res.status_code == 429 and int(res.headers["retry-after"]) >= 1
        assert env.client.post("/v1/jobs", json=job_spec(), headers=env.auth("bob")).status_code == 201
        assert env.count(Job) == 4
