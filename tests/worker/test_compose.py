"""docker-compose.yml and the Dockerfile it builds: parsed and checked (no container engine here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tunebox.serve import worker_argv
from tunebox.settings import Settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _test_cmd(service: dict) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else test


def test_services_and_health_checks(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "api", "worker"}
    assert "pg_isready" in _test_cmd(services["postgres"])
    assert "redis-cli ping" in _test_cmd(services["redis"])
    # the worker waits on the API's health: that cannot be /readyz, which waits on a worker
    assert "/healthz" in _test_cmd(services["api"]) and "/readyz" not in _test_cmd(services["api"])
    assert "inspect ping" in _test_cmd(services["worker"])
    assert services["api"]["depends_on"] == {"postgres": {"condition": "service_healthy"},
                                             "redis": {"condition": "service_healthy"}}
    assert services["worker"]["depends_on"] == {"api": {"condition": "service_healthy"}}


def test_worker_reserves_every_gpu(compose):
    devices = compose["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


def test_api_and_worker_share_database_broker_and_data(compose):
    api, worker = compose["services"]["api"], compose["services"]["worker"]
    for key in ("TUNEBOX_DATABASE_URL", "TUNEBOX_BROKER_URL", "TUNEBOX_DATA_DIR", "TUNEBOX_MODEL_ROOTS"):
        assert api["environment"][key] == worker["environment"][key]
    assert "@postgres:5432/" in api["environment"]["TUNEBOX_DATABASE_URL"]
    assert api["environment"]["TUNEBOX_BROKER_URL"].startswith("redis://redis:6379")
    assert "data:/data" in api["volumes"] and "data:/data" in worker["volumes"]
    assert set(compose["volumes"]) >= {"pgdata", "redisdata", "data", "torch-extensions"}
    # the GPU inventory and leases are keyed by the worker's host name: fixed, and the one pinged
    assert worker["hostname"] == worker["environment"]["TUNEBOX_WORKER_HOST"]


def test_dockerfile_has_the_targets_and_copies_what_exists(compose):
    text = (REPO / "Dockerfile").read_text()
    targets = set(re.findall(r"^FROM \S+ AS (\w+)$", text, re.M))
    assert {s["build"]["target"] for s in compose["services"].values() if "build" in s} <= targets
    for source in re.findall(r"^COPY (\S+?)/? ", text, re.M):
        assert (REPO / source).exists(), source


def test_worker_name_matches_the_health_check(tmp_path):
    argv = worker_argv(2, ["gpu"], Settings(data_dir=tmp_path, worker_host="gpu-box-1", gpu_count=1))
    assert argv[argv.index("--hostname") + 1] == "tunebox@gpu-box-1"
    assert argv[argv.index("--pool") + 1] == "threads"
