"""The box probe: a child process, cached per GPUs + driver + torch + DeepSpeed, stored per box, and
its fallbacks (no NVML, a crash, a timeout) to the GPU catalogue and the settings."""

from __future__ import annotations

import time

import psutil
import pytest
from sqlalchemy import delete, select

from planner import constants as C
from planner import plan
from store.db import session_scope
from store.models import BoxProbe, Gpu
from tests.worker.factories import GIB
from tests.worker.probe_boxes import FAKE_BOX
from tunebox import gpus
from tunebox.probe import box_identity, latest_probe, probe_box, probe_key, run_probe
from tunebox.settings import Settings


@pytest.fixture
def settings(tmp_path, db_url, monkeypatch) -> Settings:
    monkeypatch.setattr(gpus, "_nvml_inventory", lambda: [])
    with session_scope(db_url) as s:
        s.execute(delete(BoxProbe))
        s.execute(delete(Gpu))
    return Settings(
        database_url=db_url,
        data_dir=tmp_path,
        gpu_count=1,
        gpu_memory_bytes=24 * GIB,
        host_memory_bytes=64 * GIB,
        worker_host=f"host-{tmp_path.name}",
        box_probe_timeout_s=60,
    )


def _with_module(settings: Settings, module: str, **extra: object) -> Settings:
    return settings.model_copy(update={"box_probe_module": f"tests.worker.{module}", **extra})


def _rtx_4090_on_the_box(db_url: str, host: str) -> None:
    with session_scope(db_url) as s:
        s.add(
            Gpu(
                host=host,
                index=0,
                uuid="GPU-0000-fake",
                name="NVIDIA GeForce RTX 4090",
                memory_total_bytes=24 * GIB,
                memory_free_bytes=24 * GIB,
            )
        )


def _box_plan(db_url: str, settings: Settings):  # noqa: ANN202 - planner.Plan
    with session_scope(db_url) as s:
        hw = gpus.box_hardware(s, settings)
    return plan(
        {"model": {"name": "Qwen/Qwen2.5-0.5B"}, "training": {"max_steps": 10, "seq_len": 512}}, hardware=hw
    )


def test_the_key_changes_with_each_part_of_the_identity() -> None:
    keys = {probe_key(FAKE_BOX)}
    for part, value in (
        ("driver", "590.0"),
        ("torch", "2.12.0"),
        ("deepspeed", "0.20.0"),
        ("gpus", [{"uuid": "GPU-other", "name": "NVIDIA GeForce RTX 4090"}]),
    ):
        keys.add(probe_key({**FAKE_BOX, part: value}))
    assert len(keys) == 5
    assert probe_key(dict(reversed(list(FAKE_BOX.items())))) == probe_key(FAKE_BOX)


def test_a_box_without_nvml_stores_its_host_figures_and_plans_on_the_settings(db_url, settings) -> None:
    if box_identity()["gpus"]:
        pytest.skip("NVML sees GPUs here")
    row = probe_box(settings)
    assert row is not None and row.status == "ok"
    assert row.figures["host_memory_available_bytes"] > 0 and row.figures["nvme_free_bytes"] > 0
    assert "NVML sees no GPU" in row.figures["errors"]["gpu"]
    result = _box_plan(db_url, settings)
    assert result.hardware is not None and result.hardware.card is None
    assert result.hardware.gpu_memory_bytes.source == "setting"
    assert result.hardware.gpu_flops.source == "default"


def test_a_crashing_probe_is_stored_failed_and_plans_fall_back_to_the_catalogue(db_url, settings) -> None:
    _rtx_4090_on_the_box(db_url, settings.worker_host)
    row = probe_box(_with_module(settings, "probe_crash"), identity=FAKE_BOX)
    assert row is not None and row.status == "failed"
    assert "exited with status" in (row.error or "") and "Segmentation fault" in (row.error or "")
    result = _box_plan(db_url, settings)
    assert result.hardware is not None and result.hardware.card == "NVIDIA GeForce RTX 4090"
    assert result.hardware.gpu_flops.source == "catalogue"
    assert result.hardware.pcie_bytes_per_s.source == "catalogue"


def test_a_probe_past_its_timeout_is_stopped_with_its_children(
    db_url, settings, tmp_path, monkeypatch
) -> None:
    pids = tmp_path / "pids"
    monkeypatch.setenv("PROBE_HANG_PIDS", str(pids))
    started = time.monotonic()
    outcome = run_probe(_with_module(settings, "probe_hang", box_probe_timeout_s=3.0), FAKE_BOX)
    assert time.monotonic() - started < 30
    assert outcome.status == "failed" and "ran past 3 s" in (outcome.error or "")
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), f"process {pid} of the probe survived its timeout"


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan may wait for a parent that never reaps it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_probe_is_measured_once_per_identity_and_its_figures_reach_the_plan(db_url, settings) -> None:
    _rtx_4090_on_the_box(db_url, settings.worker_host)
    failed = probe_box(_with_module(settings, "probe_crash"), identity=FAKE_BOX)
    assert failed is not None and failed.status == "failed"
    ok = probe_box(_with_module(settings, "probe_fake"), identity=FAKE_BOX)  # a failed probe is redone
    assert ok is not None and ok.status == "ok" and ok.id == failed.id
    assert ok.figures["h2d_pinned_gbps"] == 24.0 and ok.figures["errors"]["cpu_adam_elements_per_s"]
    # the same box again: the stored figures, the child is not run (it would crash)
    again = probe_box(_with_module(settings, "probe_crash"), identity=FAKE_BOX)
    assert again is not None and again.status == "ok" and again.id == ok.id
    result = _box_plan(db_url, settings)
    hw = result.hardware
    assert hw is not None and hw.card == "NVIDIA GeForce RTX 4090"
    assert hw.pcie_bytes_per_s.source == "probe"
    assert hw.pcie_bytes_per_s.value == pytest.approx(C.PCIE_BYTES_PER_S * 24.0 / 54.84, rel=1e-3)
    # the matmul rate: the probe's 150 TFLOPS over the reference H200 probe's 775.06
    assert hw.gpu_flops.source == "probe"
    assert hw.gpu_flops.value == pytest.approx(C.DEFAULT_GPU_FLOPS * 150.0 / 775.06, rel=1e-3)
    # a new driver is a new identity: probed again; its failure leaves plans to the catalogue
    newer = probe_box(_with_module(settings, "probe_crash"), identity={**FAKE_BOX, "driver": "590.0"})
    assert newer is not None and newer.status == "failed" and newer.id != ok.id
    with session_scope(db_url) as s:
        assert latest_probe(s, settings.worker_host).id == newer.id  # type: ignore[union-attr]
        assert len(s.scalars(select(BoxProbe)).all()) == 2
    fallen_back = _box_plan(db_url, settings).hardware
    assert fallen_back.pcie_bytes_per_s.source == fallen_back.gpu_flops.source == "catalogue"  # type: ignore[union-attr]


def test_probe_off_stores_nothing(db_url, settings) -> None:
    assert probe_box(settings.model_copy(update={"box_probe": False}), identity=FAKE_BOX) is None
    with session_scope(db_url) as s:
        assert s.scalars(select(BoxProbe)).first() is None


def test_the_probe_child_on_a_box_without_cuda_reports_the_host_and_why_the_gpu_is_missing(
    db_url, settings, tmp_path
) -> None:
    outcome = run_probe(settings.model_copy(update={"nvme_path": tmp_path}), {**FAKE_BOX, "gpus": []})
    assert outcome.status == "ok", outcome.error
    figures = outcome.figures
    assert figures["nvme_dir"] == str(tmp_path) and figures["nvme_free_bytes"] > 0
    assert 0 < figures["host_memory_available_bytes"] <= 2**50
    assert figures["errors"]["gpu"] == "no CUDA device"
    assert "matmul_tflops" not in figures and "cpu_adam_elements_per_s" not in figures
