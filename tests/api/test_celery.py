"""POST /v1/jobs sends a real Celery message over Redis after the commit; a real worker receives it."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from store.db import session_scope
from store.models import Job
from tests.api.conftest import issue_tokens, job_spec, make_settings
from tests.conftest import truncate_all

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def broker(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The real ``tunebox.broker.enqueue_job`` pointed at this session's Redis database."""
    from tunebox import broker as the_broker
    from tunebox.settings import get_settings

    monkeypatch.setenv("TUNEBOX_BROKER_URL", redis_url)
    get_settings.cache_clear()
    the_broker.get_celery.cache_clear()
    yield redis_url
    get_settings.cache_clear()
    the_broker.get_celery.cache_clear()


@pytest.fixture
def celery_worker(broker: str, tmp_path: Path) -> Iterator[str]:
    key = f"probe:{secrets.token_hex(4)}"
    env = {**os.environ, "TUNEBOX_BROKER_URL": broker, "PROBE_KEY": key}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.api.celery_probe", "worker", "-Q", "gpu",
         "-P", "solo", "-c", "1", "--without-heartbeat", "--without-mingle", "--without-gossip",
         "-l", "warning"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield key
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_submitted_job_reaches_a_celery_worker(pg_url: str, roots: tuple[Path, Path], tmp_path: Path,
                                               broker: str, celery_worker: str) -> None:
    truncate_all(pg_url)
    app = create_app(make_settings(pg_url, roots, tmp_path, broker_url=broker))  # the real enqueue_job
    tokens = issue_tokens(pg_url)
    with TestClient(app) as client:
        res = client.post("/v1/jobs", json=job_spec(),
                          headers={"Authorization": f"Bearer {tokens['alice']}"})
    assert res.status_code == 201, res.text
    job_id = res.json()["id"]
    results = redis.Redis.from_url(broker)
    received = results.blpop([celery_worker], timeout=90)
    assert received is not None, "the worker received no task"
    with session_scope(pg_url) as session:
        task_id = session.get(Job, job_id).celery_task_id
    # the message carries the job id, under the id stored with the job
    assert received[1].decode() == f"{job_id} {task_id}"
    assert results.blpop([celery_worker], timeout=1) is None  # delivered once
