"""GPU inventory: the CPU stand-ins from settings, the gpus table, the box the planner sees."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete, select

from store.base import utcnow
from store.db import session_scope
from store.models import Gpu, GpuLease, Job
from store.states import JobStatus
from tests.worker.factories import GIB, job_plan, make_job, make_user
from tunebox import gpus
from tunebox.settings import Settings


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Settings:
    monkeypatch.setattr(gpus, "_nvml_inventory", lambda: [])  # behave as the CPU box even on a GPU host
    return Settings(data_dir=tmp_path, gpu_count=2, gpu_memory_bytes=24 * GIB,
                    host_memory_bytes=64 * GIB, nvme_bytes=GIB, worker_host=f"host-{tmp_path.name}")


@pytest.fixture(autouse=True)
def _empty_inventory(db_url):
    with session_scope(db_url) as s:
        s.execute(delete(GpuLease))
        s.execute(delete(Gpu))


def test_inventory_from_settings(settings):
    inv = gpus.local_inventory(settings)
    assert [(g.index, g.uuid, g.memory_total_bytes, g.healthy) for g in inv] == [
        (0, "cpu-0", 24 * GIB, True), (1, "cpu-1", 24 * GIB, True)]


def test_a_per_card_limit_is_the_memory_every_consumer_of_the_inventory_sees(db_url, settings, monkeypatch):
    card = gpus.GpuInfo(index=0, uuid="GPU-a", name="NVIDIA H200", memory_total_bytes=140 * GIB,
                        memory_free_bytes=137 * GIB)  # 3 GiB held by something else on the card
    monkeypatch.setattr(gpus, "_nvml_inventory", lambda: [card])
    limited = settings.model_copy(update={"gpu_memory_limit_bytes": 10 * GIB})
    (seen,) = gpus.local_inventory(limited)
    assert (seen.memory_total_bytes, seen.memory_free_bytes) == (10 * GIB, 7 * GIB)
    with session_scope(db_url) as s:
        gpus.sync_inventory(s, limited)
    with session_scope(db_url) as s:
        assert s.scalars(select(Gpu.memory_total_bytes)).all() == [10 * GIB]  # what leases divide
        assert gpus.box_hardware(s, limited).gpu_memory_bytes == 10 * GIB  # what plans fit into
    # a limit above the card's memory changes nothing
    (whole,) = gpus.local_inventory(settings.model_copy(update={"gpu_memory_limit_bytes": 200 * GIB}))
    assert (whole.memory_total_bytes, whole.memory_free_bytes) == (140 * GIB, 137 * GIB)


def test_no_gpu_and_no_settings_is_an_error(db_url, tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "_nvml_inventory", lambda: [])
    with session_scope(db_url) as s, pytest.raises(gpus.NoGpuError):
        gpus.box_hardware(s, Settings(data_dir=tmp_path))


def test_sync_upserts_and_marks_vanished_gpus(db_url, settings):
    with session_scope(db_url) as s:
        rows = gpus.sync_inventory(s, settings)
        assert [r.uuid for r in rows] == ["cpu-0", "cpu-1"]
    with session_scope(db_url) as s:  # a second sync updates in place
        gpus.sync_inventory(s, settings.model_copy(update={"gpu_count": 1}))
    with session_scope(db_url) as s:
        rows = s.scalars(select(Gpu).order_by(Gpu.index)).all()
        assert [(r.index, r.healthy, r.health_reason) for r in rows] == [
            (0, True, None), (1, False, "no longer present")]


def test_box_hardware_counts_only_healthy_gpus(db_url, settings):
    with session_scope(db_url) as s:
        gpus.sync_inventory(s, settings)
        s.execute(select(Gpu))
        s.scalars(select(Gpu).where(Gpu.index == 1)).one().healthy = False
    with session_scope(db_url) as s:
        hw = gpus.box_hardware(s, settings)
    assert (hw.gpu_count, hw.gpu_memory_bytes, hw.host_memory_bytes, hw.nvme_bytes) == (
        1, 24 * GIB, 64 * GIB, GIB)


def test_box_hardware_falls_back_to_local_inventory(db_url, settings):
    with session_scope(db_url) as s:
        hw = gpus.box_hardware(s, settings)
    assert (hw.gpu_count, hw.gpu_memory_bytes) == (2, 24 * GIB)


def test_list_gpus_shows_live_leases_and_unleased_memory(db_url, settings):
    with session_scope(db_url) as s:
        rows = gpus.sync_inventory(s, settings)
        job = make_job(s, make_user(s), peak=10 * GIB)
        stale = make_job(s, make_user(s), peak=5 * GIB)
        now = utcnow()
        s.add(GpuLease(gpu_id=rows[0].id, job_id=job.id, exclusive=False, memory_bytes=10 * GIB,
                       expires_at=now + timedelta(minutes=1)))
        s.add(GpuLease(gpu_id=rows[0].id, job_id=stale.id, exclusive=False, memory_bytes=5 * GIB,
                       expires_at=now - timedelta(minutes=1)))
    with session_scope(db_url) as s:
        listed = gpus.list_gpus(s, settings)
    assert [g.index for g in listed] == [0, 1]
    assert [lease.job_id for lease in listed[0].leases] == [job.id]
    assert listed[0].memory_unleased_bytes == 14 * GIB
    assert listed[1].leases == [] and listed[1].memory_unleased_bytes == 24 * GIB


def test_list_gpus_before_any_worker_reported(db_url, settings):
    with session_scope(db_url) as s:
        listed = gpus.list_gpus(s, settings)
    assert [(g.uuid, g.updated_at) for g in listed] == [("cpu-0", None), ("cpu-1", None)]


def _finished(s, owner, planned_tps: float | None, measured_tps: float | None, *, age_s: float,
              status: JobStatus = JobStatus.SUCCEEDED, factor: float | None = None,
              host: str | None = None) -> None:
    plan = job_plan()
    if planned_tps is not None:
        plan["estimated_tokens_per_second"] = planned_tps
    if factor is not None:
        plan["step_time_factor"] = factor
    make_job(s, owner, plan=plan, status=status, tokens_per_second=measured_tps,
             finished_at=utcnow() - timedelta(seconds=age_s), worker_host=host)


def test_box_learns_its_step_time_factor_from_its_latest_succeeded_jobs(db_url, settings):
    with session_scope(db_url) as s:
        s.execute(delete(Job))
        owner = make_user(s, "speed")
        box = settings.worker_host
        _finished(s, owner, 1000.0, 800.0, age_s=50, host=box)  # 1.25
        _finished(s, owner, 1000.0, 400.0, age_s=40, host=box)  # 2.5
    with session_scope(db_url) as s:  # two jobs are too few to say anything
        assert gpus.box_hardware(s, settings).step_time_factor is None
    with session_scope(db_url) as s:
        owner = make_user(s, "speed-2")
        box = settings.worker_host
        # another box's jobs say nothing about this one
        for i in range(gpus.STEP_TIME_MIN_JOBS):
            _finished(s, owner, 1000.0, 100.0, age_s=35 + i, host="another-box")
        # planned with a factor of 2 already: the box is 2 x 600 / 500 slower than the raw model
        _finished(s, owner, 600.0, 500.0, age_s=30, factor=2.0, host=box)  # 600 x 2 / 500 = 2.4
        # ignored: failed, no measured rate, or a plan without speed figures
        _finished(s, owner, 1000.0, 10.0, age_s=20, status=JobStatus.FAILED, host=box)
        _finished(s, owner, 1000.0, None, age_s=10, host=box)
        _finished(s, owner, None, 10.0, age_s=5, host=box)
    with session_scope(db_url) as s:
        hw = gpus.box_hardware(s, settings)
    assert hw.step_time_factor == pytest.approx(2.4)  # median of 1.25, 2.4, 2.5
    assert hw.sources["step_time_factor"] == "learned"
    with session_scope(db_url) as s:  # only the latest LEARNED_JOBS count
        owner = make_user(s, "speed-3")
        for i in range(gpus.LEARNED_JOBS):
            _finished(s, owner, 1000.0, 2000.0, age_s=1 - i * 0.01)  # 0.5, newer than all above
    with session_scope(db_url) as s:
        assert gpus.learned_corrections(s).step_time_factor == pytest.approx(0.5)
    with session_scope(db_url) as s:
        s.execute(delete(Job))


def test_box_with_nvme_says_whether_deepspeeds_async_io_op_builds_here(db_url, settings):
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    builds = builder is not None and builder.is_compatible(verbose=False)
    with session_scope(db_url) as s:
        hw = gpus.box_hardware(s, settings)  # nvme_bytes > 0: the box offers NVMe offload
    assert (hw.nvme_unavailable is None) == builds
    if not builds:
        assert "async I/O" in hw.nvme_unavailable
    with session_scope(db_url) as s:  # no NVMe configured: nothing to check
        assert gpus.box_hardware(s, settings.model_copy(update={"nvme_bytes": 0})).nvme_unavailable is None


def test_box_host_clock_factor_comes_from_the_settings_or_a_probe_of_a_gpu_host(db_url, settings,
                                                                                monkeypatch):
    from tests.hostclock import fake_probe
    from tunebox import hostclock

    probed = fake_probe(monkeypatch, 2.0)
    with session_scope(db_url) as s:  # CPU stand-ins: the constants' host, nothing probed
        assert gpus.box_hardware(s, settings).host_clock_factor is None
    assert probed == []
    with session_scope(db_url) as s:  # the settings' figure wins
        hw = gpus.box_hardware(s, settings.model_copy(update={"host_clock_factor": 1.7}))
    assert hw.host_clock_factor == 1.7
    # a host whose NVML sees GPUs: probed once, in a child, on CUDA; the figure is kept
    monkeypatch.setattr(hostclock, "_measured", {})
    assert hostclock.box_host_clock_factor(settings, lambda: True) == 2.0
    assert hostclock.box_host_clock_factor(settings, lambda: True) == 2.0
    assert probed == ["cuda"]
    monkeypatch.setattr(hostclock, "_measured", {})
    unprobed = settings.model_copy(update={"host_probe": False})
    assert hostclock.box_host_clock_factor(unprobed, lambda: True) is None


def test_an_old_host_clock_figure_is_probed_again_in_the_background(settings, monkeypatch):
    """Once the figure is older than host_probe_max_age_s, the next plan gets it while a thread
    probes again; the plans after take the new figure. A failed re-probe keeps the old one."""
    import threading

    from planner.constants import HOST_HOOK_REFERENCE_US
    from tests.hostclock import fake_probe
    from tunebox import hostclock

    probed = fake_probe(monkeypatch, 2.0)
    quick = settings.model_copy(update={"host_probe_max_age_s": 60.0})
    assert hostclock.box_host_clock_factor(quick, lambda: True) == 2.0
    assert hostclock.box_host_clock_factor(quick, lambda: True) == 2.0  # still fresh
    assert probed == ["cuda"]
    readings = iter([{"hooked_module_us": 1.5 * HOST_HOOK_REFERENCE_US}, {}])
    release = threading.Event()

    def child(device: str) -> dict[str, float]:
        release.wait(10)
        probed.append(device)
        return next(readings)

    monkeypatch.setattr(hostclock, "_probe_in_child", child)

    def age() -> None:
        hostclock._taken["cuda"] -= 61.0

    def refreshed() -> None:
        release.set()
        for thread in threading.enumerate():
            if thread.name == "host-clock-refresh":
                thread.join(10)
        release.clear()

    age()
    assert hostclock.box_host_clock_factor(quick, lambda: True) == 2.0  # the old figure, at once
    assert hostclock.box_host_clock_factor(quick, lambda: True) == 2.0  # one re-probe at a time
    refreshed()
    assert probed == ["cuda", "cuda"]
    assert hostclock.box_host_clock_factor(quick, lambda: True) == 1.5
    age()
    assert hostclock.box_host_clock_factor(quick, lambda: True) == 1.5
    refreshed()  # this probe fails: the figure stays, and is not probed again until it is old
    assert probed == ["cuda", "cuda", "cuda"]
    assert hostclock.box_host_clock_factor(quick, lambda: True) == 1.5
    assert probed == ["cuda", "cuda", "cuda"]
    # a box without GPUs never probes, however old its answer
    monkeypatch.setattr(hostclock, "_measured", {})
    assert hostclock.box_host_clock_factor(quick, lambda: False) is None
    assert hostclock.box_host_clock_factor(quick, lambda: False) is None
    assert probed == ["cuda", "cuda", "cuda"]


def test_host_probe_runs_in_its_own_process_and_reports_microseconds():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tunebox.hostclock", "--device", "cpu"], capture_output=True,
                          text=True, timeout=300, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["device"] == "cpu"
    for key in ("python_loop_1000_us", "tensor_op_us", "hooked_module_us"):
        assert 0 < figures[key] < 100_000, key
    # a hooked module call is a tensor op plus Python around it
    assert figures["hooked_module_us"] > figures["tensor_op_us"]


def test_box_hardware_says_whether_nvme_swap_shares_the_job_folders_disk(db_url, settings, tmp_path):
    """The NVMe folder on the disk of the job folders (a folder beside them) or not (none set; a
    tmpfs where the box has one)."""
    on_disk = settings.model_copy(update={"nvme_path": tmp_path / "nvme"})
    with session_scope(db_url) as s:
        assert gpus.box_hardware(s, on_disk).nvme_on_job_disk is True
        assert gpus.box_hardware(s, settings.model_copy(update={"nvme_path": None})).nvme_on_job_disk is False
    shm = Path("/dev/shm")
    if shm.is_dir() and os.stat(shm).st_dev != os.stat(tmp_path).st_dev:
        elsewhere = settings.model_copy(update={"nvme_path": shm})
        with session_scope(db_url) as s:
            assert gpus.box_hardware(s, elsewhere).nvme_on_job_disk is False
