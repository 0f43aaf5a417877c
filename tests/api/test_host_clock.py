"""The service probes its box's host clock when it starts, and its plans carry the figure."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.api.conftest import BOX, Env, job_spec
from tests.hostclock import fake_probe
from tunebox import gpus, hostclock


def test_service_probes_its_host_clock_at_start_and_plans_scale_their_host_clock(
        pg_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    for thread in threading.enumerate():  # the fixture's own service probed at its start
        if thread.name == "host-clock-probe":
            thread.join(30)
    gpu = gpus.GpuInfo(index=0, uuid="GPU-0", name="NVIDIA H200", memory_total_bytes=BOX["gpu_memory_bytes"],
                       memory_free_bytes=BOX["gpu_memory_bytes"])
    monkeypatch.setattr(gpus, "_nvml_inventory", lambda: [gpu])  # a host whose NVML sees a GPU
    probed = fake_probe(monkeypatch, 1.5)
    app = create_app(pg_env.settings, enqueue=pg_env.enqueued)
    with TestClient(app) as client:
        deadline = time.monotonic() + 30
        while "cuda" not in hostclock._measured and time.monotonic() < deadline:
            time.sleep(0.01)
        assert probed == ["cuda"]  # at start, before any plan asked
        res = client.post("/v1/plans", json=job_spec(), headers=pg_env.auth())
        assert res.status_code == 200, res.text
        assert res.json()["host_clock_factor"] == 1.5
    assert probed == ["cuda"]  # not again while the figure is fresh
