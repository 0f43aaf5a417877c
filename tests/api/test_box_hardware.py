"""Plans for the service's own box: the card from its inventory, the box probe's figures, the
correction learned from its finished jobs; GET /v1/gpus, GET /v1/calibration, /metrics and
``tunebox gpus`` show them."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from api.app import create_app
from store.base import utcnow
from store.db import session_scope
from store.ids import new_id
from store.models import Gpu, Job, User
from store.states import JobStatus
from tests.api.conftest import BOX, Env, build_env, job_spec, serve_in_thread
from tests.worker.probe_boxes import FAKE_BOX
from tunebox.cli import main
from tunebox.gpus import MEMORY_MIN_JOBS, STEP_TIME_MIN_JOBS
from tunebox.probe import probe_box

GiB = 1024**3


@pytest.fixture
def pg_env(pg_url: str, roots: tuple[Path, Path], tmp_path: Path) -> Iterator[Env]:
    """The API with no GPU rows yet: these tests place the box's cards themselves."""
    yield from build_env(pg_url, roots, tmp_path, worker=False)


def _plan(env: Env) -> dict[str, Any]:
    res = env.client.post("/v1/plans", json=job_spec(), headers=env.auth())
    assert res.status_code == 200, res.text
    return dict(res.json())


def _box(env: Env) -> str:
    return env.settings.worker_host or socket.gethostname()


def _card_on_the_box(env: Env, name: str = "NVIDIA GeForce RTX 4090") -> None:
    with session_scope(env.url) as s:
        s.add(
            Gpu(
                host=_box(env),
                index=0,
                uuid="GPU-0000-fake",
                name=name,
                memory_total_bytes=BOX["gpu_memory_bytes"],
                memory_free_bytes=BOX["gpu_memory_bytes"],
            )
        )


def _finished_jobs(env: Env, plan: dict[str, Any], slower: float, n: int, *, gpu_over: float = 1.0) -> None:
    """``n`` succeeded jobs of ``plan`` on the box, measured ``slower`` times its step time."""
    with session_scope(env.url) as s:
        owner = s.query(User).filter_by(name="alice").one()
        for i in range(n):
            s.add(
                Job(
                    id=new_id("job"),
                    owner_id=owner.id,
                    name="done",
                    spec=job_spec(),
                    plan=plan,
                    status=JobStatus.SUCCEEDED,
                    worker_host=_box(env),
                    tokens_per_second=plan["estimated_tokens_per_second"] / slower,
                    planned_peak_gpu_bytes=plan["per_gpu"]["total_bytes"],
                    measured_peak_gpu_bytes=int(plan["per_gpu"]["total_bytes"] * gpu_over),
                    planned_host_bytes=plan["host"]["total_bytes"],
                    measured_host_rss_bytes=plan["host"]["total_bytes"] // 2,
                    finished_at=utcnow() - timedelta(seconds=10 - i),
                )
            )


def test_the_boxs_card_from_its_inventory_flows_into_its_plans(pg_env: Env) -> None:
    stand_in = _plan(pg_env)["hardware"]
    assert stand_in["card"] is None and stand_in["gpu_memory_bytes"]["source"] == "setting"
    assert stand_in["gpu_flops"]["source"] == "default"
    _card_on_the_box(pg_env)
    hw = _plan(pg_env)["hardware"]
    assert hw["card"] == "NVIDIA GeForce RTX 4090" and hw["gpu_flops"]["source"] == "catalogue"
    assert hw["gpu_flops"]["value"] < stand_in["gpu_flops"]["value"] / 4


def test_a_learned_correction_moves_the_next_plan_and_says_so(pg_env: Env) -> None:
    first = _plan(pg_env)
    assert first["hardware"]["step_time_factor"]["source"] == "default"
    _finished_jobs(pg_env, first, slower=2.0, n=STEP_TIME_MIN_JOBS)
    second = _plan(pg_env)
    assert second["step_time_factor"] == pytest.approx(2.0)
    assert second["hardware"]["step_time_factor"] == {
        "value": 2.0,
        "unit": "ratio",
        "source": "learned",
        "detail": None,
    }
    assert second["estimated_step_seconds"] == pytest.approx(2 * first["estimated_step_seconds"], rel=1e-3)
    assert second["estimated_tokens_per_second"] == pytest.approx(
        first["estimated_tokens_per_second"] / 2, rel=1e-3
    )


def _held(plan: dict[str, Any], share: float) -> float:
    """``gpu_over`` for jobs that held the plan's allocated peak and ``share`` of the room it gave the
    allocator's slack and the CUDA context."""
    g = plan["per_gpu"]
    room = g["allocator_slack_bytes"] + g["cuda_context_bytes"]
    return float((g["total_bytes"] - room + share * room) / g["total_bytes"])


@pytest.mark.parametrize("shares", [(0.5, 0.7, 0.6), (1.3, 1.6, 1.1)], ids=["held-less", "held-more"])
def test_a_learned_memory_correction_scales_the_next_plans_slack_and_context(
        pg_env: Env, shares: tuple[float, float, float]) -> None:
    """The box's finished jobs held their allocated peaks and part (or more) of the room their plans
    gave the allocator and the context: the next plan gives the room the most demanding of them
    needed, and its allocated figures stay what the structure says."""
    first = _plan(pg_env)
    assert first["hardware"]["gpu_memory_correction"]["source"] == "default"
    assert len(shares) >= MEMORY_MIN_JOBS
    for share in shares:
        _finished_jobs(pg_env, first, slower=1.0, n=1, gpu_over=_held(first, share))
    second = _plan(pg_env)
    assert second["hardware"]["gpu_memory_correction"]["source"] == "learned"
    assert second["hardware"]["gpu_memory_correction"]["value"] == pytest.approx(max(shares), abs=1e-3)
    a, b = first["per_gpu"], second["per_gpu"]
    for term in ("forward_backward_bytes", "optimizer_step_bytes", "weights_bytes", "activations_bytes"):
        assert b[term] == a[term]
    assert b["allocator_slack_bytes"] == pytest.approx(max(shares) * a["allocator_slack_bytes"], rel=1e-3)
    room = a["allocator_slack_bytes"] + a["cuda_context_bytes"]
    assert b["total_bytes"] == pytest.approx(a["total_bytes"] + (max(shares) - 1) * room, rel=1e-3)
    # the second plan's own jobs teach the same correction, not a compounded one
    _finished_jobs(pg_env, second, slower=1.0, n=MEMORY_MIN_JOBS, gpu_over=_held(first, max(shares))
                   * a["total_bytes"] / b["total_bytes"])
    third = _plan(pg_env)
    assert third["hardware"]["gpu_memory_correction"]["value"] == pytest.approx(max(shares), abs=1e-3)


def test_calibration_and_metrics_show_planned_against_measured_per_box(pg_env: Env) -> None:
    plan = _plan(pg_env)
    _finished_jobs(pg_env, plan, slower=1.5, n=STEP_TIME_MIN_JOBS, gpu_over=1.1)
    res = pg_env.client.get("/v1/calibration", headers=pg_env.auth())
    assert res.status_code == 200, res.text
    [box] = res.json()["boxes"]
    assert box["host"] == _box(pg_env) and box["jobs"] == STEP_TIME_MIN_JOBS
    assert box["step_time_factor"] == pytest.approx(1.5)
    assert box["step_time"]["median"] == pytest.approx(1.5) and box["step_time"]["median_abs_error"] == 0.5
    assert box["gpu_peak"]["median"] == pytest.approx(1.1, rel=1e-3)
    g = plan["per_gpu"]  # each job held 10% of its plan's total beyond it: that much more room
    room = g["allocator_slack_bytes"] + g["cuda_context_bytes"]
    correction = 1 + 0.1 * g["total_bytes"] / room
    assert box["gpu_memory_correction"] == pytest.approx(correction, abs=1e-3)
    assert box["host_peak"]["median"] == pytest.approx(0.5, rel=1e-3)
    assert len(box["history"]) == STEP_TIME_MIN_JOBS
    assert pg_env.client.get(
        "/v1/calibration", params={"host": "elsewhere"}, headers=pg_env.auth()
    ).json() == {"boxes": []}
    assert pg_env.client.get("/v1/calibration").status_code == 401
    metrics = pg_env.client.get("/metrics").text
    host = _box(pg_env)
    assert f'tunebox_calibration_step_time_ratio{{host="{host}",stat="median"}} 1.5' in metrics
    assert f'tunebox_calibration_step_time_factor{{host="{host}"}} 1.5' in metrics
    learned = box["gpu_memory_correction"]
    assert f'tunebox_calibration_gpu_memory_correction{{host="{host}"}} {learned}' in metrics
    assert f'tunebox_calibration_jobs{{host="{host}"}} {float(STEP_TIME_MIN_JOBS)}' in metrics


def test_gpus_lists_each_boxs_probe_and_the_cli_prints_it(
    pg_env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _card_on_the_box(pg_env)
    settings = pg_env.settings.model_copy(update={"box_probe_module": "tests.worker.probe_fake"})
    row = probe_box(settings, identity=FAKE_BOX)
    assert row is not None and row.status == "ok"
    res = pg_env.client.get("/v1/gpus", headers=pg_env.auth())
    assert res.status_code == 200, res.text
    [box] = res.json()["boxes"]
    assert box["host"] == _box(pg_env) and box["status"] == "ok"
    assert box["figures"]["h2d_pinned_gbps"] == 24.0
    from planner.constants import DEFAULT_GPU_FLOPS

    # the probe's rates over the reference H200 probe's (planner/data/gpus.json): 775.06 TFLOPS, 54.84 GB/s
    assert box["planned_from_probe"] == {
        "gpu_bf16_tflops": pytest.approx(DEFAULT_GPU_FLOPS / 1e12 * 150.0 / 775.06, rel=1e-3),
        "pcie_gbps": pytest.approx(25 * 24.0 / 54.84, rel=1e-3)}
    assert _plan(pg_env)["hardware"]["pcie_bytes_per_s"]["source"] == "probe"

    app = create_app(pg_env.settings, enqueue=pg_env.enqueued, token_cache_ttl_s=0)
    with serve_in_thread(app) as url:
        monkeypatch.setenv("TUNEBOX_URL", url)
        monkeypatch.setenv("TUNEBOX_TOKEN", pg_env.tokens["alice"])
        assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA GeForce RTX 4090" in out
    assert f"probe of {_box(pg_env)}" in out and "h2d 24.0 GB/s" in out and "matmul 150.0 TFLOPS" in out
    assert "not measured: cpu_adam_elements_per_s: not built here" in out
