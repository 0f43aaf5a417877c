"""The worker that ``tunebox serve`` runs beside the API: while it keeps dying, ``/readyz`` says
why and new jobs are refused with a 503 naming the reason; a box without a GPU says which settings
let the CPU stand in."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from store.models import Job
from tests.api.conftest import Env, build_env, job_spec
from tunebox.serve import EmbeddedWorker

BROKEN = [sys.executable, "-c",
          "import sys; print('starting', file=sys.stderr); "
          "sys.exit(\"ModuleNotFoundError: No module named 'tunebox_missing'\")"]
RUNNING = [sys.executable, "-c", "import time; time.sleep(600)"]


def _until(predicate, timeout_s: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture
def broken_worker(pg_env: Env) -> Iterator[EmbeddedWorker]:
    worker = EmbeddedWorker(pg_env.settings, argv=BROKEN)
    worker.start()
    yield worker
    worker.stop()


def test_a_worker_that_keeps_dying_makes_the_api_not_ready_and_refuse_jobs(
        pg_env: Env, broken_worker: EmbeddedWorker) -> None:
    assert broken_worker.problem() is None  # one exit is not yet a loop
    _until(lambda: broken_worker.problem() is not None)
    reason = broken_worker.problem()
    assert reason is not None
    assert "exited 3 times" in reason and "No module named 'tunebox_missing'" in reason
    app = create_app(pg_env.settings, enqueue=pg_env.enqueued, token_cache_ttl_s=0,
                     worker_problem=broken_worker.problem)
    with TestClient(app) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert [e["field"] for e in ready.json()["errors"]] == ["worker"]
        assert "tunebox_missing" in ready.json()["errors"][0]["message"]
        refused = client.post("/v1/jobs", json=job_spec(), headers=pg_env.auth())
        assert refused.status_code == 503 and refused.headers["content-type"] == "application/problem+json"
        assert "tunebox_missing" in refused.json()["detail"]
        assert [e["field"] for e in refused.json()["errors"]] == ["worker"]
        assert client.post("/v1/plans", json=job_spec(), headers=pg_env.auth()).status_code == 200
    assert pg_env.count(Job) == 0 and pg_env.enqueued.calls == []


def test_a_running_worker_is_no_problem(pg_env: Env) -> None:
    worker = EmbeddedWorker(pg_env.settings, argv=RUNNING)
    worker.start()
    try:
        time.sleep(2.5)  # two rounds of the watcher
        assert worker.proc is not None and worker.proc.poll() is None and worker.problem() is None
        app = create_app(pg_env.settings, enqueue=pg_env.enqueued, token_cache_ttl_s=0,
                         worker_problem=worker.problem)
        with TestClient(app) as client:
            assert client.get("/readyz").status_code == 200
            assert client.post("/v1/jobs", json=job_spec(), headers=pg_env.auth()).status_code == 201
    finally:
        worker.stop()
    assert worker.proc.poll() is not None  # stopped with the server


def test_no_gpu_names_the_settings_that_let_the_cpu_stand_in(pg_url: str, roots: tuple[Path, Path],
                                                             tmp_path: Path) -> None:
    for env in build_env(pg_url, roots, tmp_path, gpu_count=None, gpu_memory_bytes=None):
        res = env.client.post("/v1/jobs", json=job_spec(), headers=env.auth())
        if res.status_code != 503:
            pytest.skip("this machine has a GPU")
        detail = res.json()["detail"]
        assert "TUNEBOX_GPU_COUNT=1" in detail and f"TUNEBOX_GPU_MEMORY_BYTES={16 * 2**30}" in detail
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    fresh = readme[readme.index("## On a fresh machine"):readme.index("## Using it")]
    assert f"TUNEBOX_GPU_COUNT=1 TUNEBOX_GPU_MEMORY_BYTES={16 * 2**30} .venv/bin/tunebox serve" in fresh
