"""The box's GPU inventory: NVML where there are GPUs, the settings where there are none.

A worker upserts its host's GPUs into the ``gpus`` table at start and periodically; the API reads
that table (``list_gpus``, ``box_hardware``). A card NVML reports as damaged (uncorrectable ECC
errors, pages or rows waiting for retirement, lost from the bus) is kept with ``healthy=False`` and a
reason, and leasing never hands it out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import socket
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from sqlalchemy import or_, select

from planner.spec import FigureSource, HardwareSpec
from store import leases
from store.base import utcnow
from store.models import Gpu, GpuLease, Job
from store.states import JobStatus
from tunebox.hostclock import box_host_clock_factor

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from tunebox.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as seen on this host right now."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_free_bytes: int | None
    healthy: bool = True
    health_reason: str | None = None


class GpuLeaseStatus(BaseModel):
    job_id: str
    exclusive: bool
    memory_bytes: int
    heartbeat_at: datetime
    expires_at: datetime


class GpuStatus(BaseModel):
    """One GPU for ``GET /v1/gpus``: inventory, health, live leases and what is left."""

    host: str
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_free_bytes: int | None  # as the driver reported it at the last refresh
    memory_unleased_bytes: int  # total minus the live leases' planned bytes
    healthy: bool
    health_reason: str | None
    updated_at: datetime | None
    leases: list[GpuLeaseStatus]


def host_name(settings: Settings) -> str:
    return settings.worker_host or socket.gethostname()


# --------------------------------------------------------------------------- local inventory


def local_inventory(settings: Settings) -> list[GpuInfo]:
    """This host's GPUs from NVML; where NVML sees none, the CPU stand-ins the settings describe.
    Each card's memory is what jobs may use of it: the box's per-card limit where it sets one."""
    gpus = _nvml_inventory() or _settings_inventory(settings)
    limit = settings.gpu_memory_limit_bytes
    return [_limited(g, limit) for g in gpus] if limit else gpus


#: the uuid prefix of the settings' CPU stand-ins for cards
STAND_IN_UUID = "cpu-"


def device_of_uuids(uuids: Iterable[str]) -> str:
    """``cpu`` where every card is a settings stand-in (the CPU trains), else ``cuda``."""
    return "cpu" if all(u.startswith(STAND_IN_UUID) for u in uuids) else "cuda"


def box_device(settings: Settings) -> str:
    """``cuda`` where NVML sees GPUs on this host, else ``cpu`` (the settings' stand-ins)."""
    return device_of_uuids(g.uuid for g in local_inventory(settings))


def _limited(info: GpuInfo, limit: int) -> GpuInfo:
    """``info`` as jobs see it where they may use ``limit`` bytes of the card: what others hold on
    it (total less free) counts against that share."""
    if not info.memory_total_bytes or info.memory_total_bytes <= limit:
        return info
    free = info.memory_free_bytes
    if free is not None:
        free = max(0, limit - (info.memory_total_bytes - free))
    return dataclasses.replace(info, memory_total_bytes=limit, memory_free_bytes=free)


def _settings_inventory(settings: Settings) -> list[GpuInfo]:
    count = settings.gpu_count or 0
    memory = settings.gpu_memory_bytes or _host_memory_bytes(settings)
    return [GpuInfo(index=i, uuid=f"{STAND_IN_UUID}{i}", name="cpu", memory_total_bytes=memory,
                    memory_free_bytes=memory) for i in range(count)]


def _nvml_inventory() -> list[GpuInfo]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []  # no driver: a CPU box
    try:
        return [_nvml_device(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def _nvml_device(pynvml: Any, index: int) -> GpuInfo:
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        name = _text(pynvml.nvmlDeviceGetName(handle))
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    except pynvml.NVMLError as exc:
        # a card lost from the bus still occupies its index; keep it visible, out of leasing
        return GpuInfo(index=index, uuid=f"unknown-{index}", name="unknown", memory_total_bytes=0,
                       memory_free_bytes=None, healthy=False, health_reason=_nvml_error_reason(exc))
    reason = _nvml_health_problem(pynvml, handle)
    return GpuInfo(index=index, uuid=uuid, name=name, memory_total_bytes=int(mem.total),
                   memory_free_bytes=int(mem.free), healthy=reason is None, health_reason=reason)


def _nvml_health_problem(pynvml: Any, handle: Any) -> str | None:
    """The first reason this card should not take work, or None. Unsupported queries are skipped."""
    checks = (
        (lambda: pynvml.nvmlDeviceGetTotalEccErrors(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                    pynvml.NVML_VOLATILE_ECC),
         lambda n: f"{n} uncorrectable ECC errors since the driver loaded" if n else None),
        (lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle),
         lambda pending: "retired memory pages pending (reset the GPU)" if pending else None),
        (lambda: pynvml.nvmlDeviceGetRemappedRows(handle),
         _remapped_rows_problem),
    )
    for query, judge in checks:
        try:
            value = query()
        except pynvml.NVMLError as exc:
            if isinstance(exc, pynvml.NVMLError_GpuIsLost):
                return "lost from the bus"
            continue  # not supported on this card / driver
        problem = judge(value)
        if problem:
            return problem
    return None


def _remapped_rows_problem(value: Any) -> str | None:
    _corrected, _uncorrected, pending, failure = value
    if failure:
        return "row remapping failed"
    return "remapped memory rows pending (reset the GPU)" if pending else None


def _nvml_error_reason(exc: Exception) -> str:
    import pynvml

    if isinstance(exc, pynvml.NVMLError_GpuIsLost):
        return "lost from the bus"
    return f"NVML error: {exc}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _host_memory_bytes(settings: Settings) -> int:
    if settings.host_memory_bytes:
        return settings.host_memory_bytes
    import psutil

    return int(psutil.virtual_memory().total)


# --------------------------------------------------------------------------- the gpus table


def sync_inventory(session: Session, settings: Settings) -> list[Gpu]:
    """Upsert this host's GPUs; a GPU that vanished from the host is kept but marked unhealthy."""
    host = host_name(settings)
    seen = {g.index: g for g in local_inventory(settings)}
    rows = {r.index: r for r in session.scalars(select(Gpu).where(Gpu.host == host))}
    now = utcnow()
    for index, info in seen.items():
        row = rows.get(index)
        if row is None:
            row = Gpu(host=host, index=index)
            session.add(row)
            rows[index] = row
        _copy_info(row, info, now)
    for index, row in rows.items():
        if index not in seen:
            row.healthy, row.health_reason, row.memory_free_bytes = False, "no longer present", None
            row.updated_at = now
    session.flush()
    return sorted(rows.values(), key=lambda r: r.index)


def _copy_info(row: Gpu, info: GpuInfo, now: datetime) -> None:
    row.uuid, row.name = info.uuid, info.name
    if info.memory_total_bytes or row.memory_total_bytes is None:
        row.memory_total_bytes = info.memory_total_bytes
    row.memory_free_bytes = info.memory_free_bytes
    row.healthy, row.health_reason = info.healthy, info.health_reason
    row.updated_at = now


def box_hardware(session: Session, settings: Settings) -> HardwareSpec:
    """The box jobs are planned against: healthy GPUs from the table, else this host's inventory;
    its card's rate and PCIe link from the box probe where it measured them (the planner falls back
    to the GPU catalogue, then its defaults); each figure's source named in ``sources``.

    Raises :class:`NoGpuError` where there is no GPU and the settings describe none.
    """
    table_host, count, memory, name = _table_box(session)
    host = table_host or host_name(settings)
    if count == 0:
        local = [g for g in local_inventory(settings) if g.healthy]
        count = len(local)
        memory = min((g.memory_total_bytes for g in local), default=0)
        name = local[0].name if local else None
    if count == 0 or memory <= 0:
        raise NoGpuError("no healthy GPU on this box; on a machine without GPUs set TUNEBOX_GPU_COUNT "
                         "and TUNEBOX_GPU_MEMORY_BYTES to let the CPU stand in")
    stand_in = name == "cpu"
    sources: dict[str, FigureSource] = {
        "gpu_memory_bytes": "setting" if stand_in or settings.gpu_memory_limit_bytes else "probe",
        "host_memory_bytes": "setting" if settings.host_memory_bytes else "probe",
        "nvme_bytes": "setting",
    }
    rates = {} if stand_in else probed_rates(session, host)
    sources.update(dict.fromkeys(rates, "probe"))
    tflops, pcie = rates.get("gpu_bf16_tflops"), rates.get("pcie_gbps")
    learned = learned_corrections(session, host)
    step_factor, memory_correction = learned.step_time_factor, learned.gpu_memory_correction
    if step_factor is not None:
        sources["step_time_factor"] = "learned"
    if memory_correction is not None:
        sources["gpu_memory_correction"] = "learned"
    clock = box_host_clock(settings)
    if clock is not None:
        sources["host_clock_factor"] = "setting" if settings.host_clock_factor is not None else "probe"
    return HardwareSpec(gpu_count=count, gpu_memory_bytes=memory, gpu_name=None if stand_in else name,
                        host_memory_bytes=_host_memory_bytes(settings), nvme_bytes=settings.nvme_bytes,
                        nvme_path=str(settings.nvme_path) if settings.nvme_path else None,
                        step_time_factor=step_factor, host_clock_factor=clock,
                        gpu_memory_correction=memory_correction,
                        nvme_unavailable=nvme_unavailable(settings), gpu_bf16_tflops=tflops, pcie_gbps=pcie,
                        disk_free_bytes=job_disk_free_bytes(settings),
                        nvme_on_job_disk=nvme_on_job_disk(settings), sources=sources)


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def job_disk_free_bytes(settings: Settings) -> int | None:
    """Free bytes of the disk the job folders (and their checkpoints) are written to."""
    try:
        return int(shutil.disk_usage(_existing(settings.data_dir / "jobs")).free)
    except OSError:
        return None


def nvme_on_job_disk(settings: Settings) -> bool:
    """Whether the NVMe offload folder is on the disk of the job folders (one device)."""
    if settings.nvme_path is None:
        return False
    try:
        return (os.stat(_existing(settings.nvme_path)).st_dev
                == os.stat(_existing(settings.data_dir / "jobs")).st_dev)
    except OSError:
        return False


def probed_rates(session: Session, host: str) -> dict[str, float]:
    """``gpu_bf16_tflops`` and ``pcie_gbps`` of ``host`` from its latest successful box probe, in the
    planner's terms (planner/hardware.py); empty where it has none."""
    from planner.hardware import pcie_bytes_per_s_from_probe, tflops_from_probe
    from tunebox.probe import latest_probe

    probe = latest_probe(session, host)
    if probe is None or probe.status != "ok":
        return {}
    rates: dict[str, float] = {}
    matmul, h2d = probe.figures.get("matmul_tflops"), probe.figures.get("h2d_pinned_gbps")
    if isinstance(matmul, int | float) and (tflops := tflops_from_probe(float(matmul))) is not None:
        rates["gpu_bf16_tflops"] = round(tflops, 3)
    if isinstance(h2d, int | float) and (pcie := pcie_bytes_per_s_from_probe(float(h2d))) is not None:
        rates["pcie_gbps"] = round(pcie / 1e9, 3)
    return rates


def box_host_clock(settings: Settings) -> float | None:
    """This box's ``hardware.host_clock_factor`` (tunebox/hostclock.py): probed where NVML sees GPUs,
    and again in the background once ``host_probe_max_age_s`` old. The service starts the first
    probe when it starts; a plan that arrives while it runs waits for its figure."""
    return box_host_clock_factor(settings, lambda: bool(_nvml_inventory()))


def nvme_unavailable(settings: Settings) -> str | None:
    """Why the NVMe offload this box offers cannot run (None where it can, or where it offers none)."""
    return nvme_offload_problem() if settings.nvme_bytes > 0 else None


@functools.cache
def nvme_offload_problem() -> str | None:
    """Why DeepSpeed's NVMe offload cannot run on this box, or None: it swaps through DeepSpeed's
    async I/O op, which builds only where libaio and its headers are installed. Asked once per
    process (the check compiles a probe)."""
    try:
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder("AsyncIOBuilder")
        if builder is None:
            return "DeepSpeed has no async I/O op for this accelerator"
        if not builder.is_compatible(verbose=False):
            return ("DeepSpeed's async I/O op does not build here: it needs libaio with its headers "
                    "(the libaio-dev package)")
    except Exception as exc:  # a broken DeepSpeed install is a reason too
        return f"DeepSpeed's async I/O op could not be checked ({type(exc).__name__}: {exc})"
    return None


#: How many of the latest succeeded jobs a box's corrections are learned from, and the fewest each
#: needs: one job's rate or peak says little (its last steps, a checkpoint, a neighbour's load).
LEARNED_JOBS = 20
STEP_TIME_MIN_JOBS = 3
MEMORY_MIN_JOBS = 3
STEP_TIME_FACTOR_BOUNDS = (0.1, 100.0)
#: the memory correction's bounds (the spec's): at most 4x the planned slack and context, at least a
#: quarter of them
MEMORY_CORRECTION_BOUNDS = (0.25, 4.0)


@dataclass(frozen=True)
class Learned:
    """What a box's finished jobs teach its next plans (None: too few jobs yet)."""

    step_time_factor: float | None
    gpu_memory_correction: float | None


def memory_correction_ratio(total: float | None, slack: float | None, context: float | None,
                            carried: float | None, measured_peak: float) -> float | None:
    """What one job held beyond its plan's allocated peak (its ``per_gpu`` total, slack and context),
    over what its plan gave that room before the correction it already ``carried``."""
    if not total or slack is None or context is None or slack + context <= 0:
        return None
    room = (slack + context) / (carried or 1.0)
    return max(0.0, measured_peak - (total - slack - context)) / room


def learned_corrections(session: Session, host: str | None = None) -> Learned:
    """The box's (``host``'s; every box's where None) corrections, from its latest succeeded jobs that
    measured their rate or their GPU peak, in one read of a few figures of each plan, not the whole
    plans (this runs on every plan and submission):

    - the step-time factor: the median of planned over measured tokens/s, each times the factor its
      own plan already carried;
    - the memory correction: the largest ratio (:func:`memory_correction_ratio`), so no recent job of
      the box would have been planned short by it, and where they all held less than planned the
      plans shrink to what the most demanding of them needed.
    """
    figures = [Job.plan[path].as_float() for path in (
        ("estimated_tokens_per_second",), ("step_time_factor",), ("per_gpu", "total_bytes"),
        ("per_gpu", "allocator_slack_bytes"), ("per_gpu", "cuda_context_bytes"),
        ("hardware", "gpu_memory_correction", "value"))]
    query = (select(*figures, Job.tokens_per_second, Job.measured_peak_gpu_bytes)
             .where(Job.status == JobStatus.SUCCEEDED,
                    or_(Job.tokens_per_second > 0, Job.measured_peak_gpu_bytes > 0))
             .order_by(Job.finished_at.desc()).limit(LEARNED_JOBS))
    if host is not None:
        query = query.where(Job.worker_host == host)
    steps, memory = [], []
    for planned, carried, total, slack, context, carried_memory, rate, peak in session.execute(query):
        if planned and rate:
            steps.append(planned * (carried or 1.0) / rate)
        ratio = memory_correction_ratio(total, slack, context, carried_memory, float(peak)) if peak else None
        if ratio is not None:
            memory.append(ratio)
    step = None
    if len(steps) >= STEP_TIME_MIN_JOBS:
        low, high = STEP_TIME_FACTOR_BOUNDS
        step = round(min(high, max(low, statistics.median(steps))), 4)
    correction = None
    if len(memory) >= MEMORY_MIN_JOBS:
        low, high = MEMORY_CORRECTION_BOUNDS
        correction = round(min(high, max(low, max(memory))), 4)
    return Learned(step, correction)


def _table_box(session: Session) -> tuple[str | None, int, int, str | None]:
    """(host, count, smallest memory, card name) of the healthy GPUs of the host with the most; a job
    runs on one host."""
    by_host: dict[str, list[tuple[int, str]]] = {}
    rows = session.execute(select(Gpu.host, Gpu.memory_total_bytes, Gpu.name).where(Gpu.healthy))
    for host, total, name in rows:
        by_host.setdefault(host, []).append((int(total), name))
    if not by_host:
        return None, 0, 0, None
    host, best = max(by_host.items(), key=lambda item: len(item[1]))
    smallest = min(best)
    return host, len(best), smallest[0], smallest[1]


class NoGpuError(RuntimeError):
    """Neither NVML nor the settings describe a GPU to plan or run on."""


def list_gpus(session: Session, settings: Settings) -> list[GpuStatus]:
    """Every known GPU with its live leases; this host's inventory if no worker has reported yet."""
    rows = list(session.scalars(select(Gpu).order_by(Gpu.host, Gpu.index)))
    if not rows:
        return [_unreported_status(host_name(settings), g) for g in local_inventory(settings)]
    live = leases.live_by_gpu(session, utcnow())
    return [_status(row, live.get(row.id, [])) for row in rows]


def _status(row: Gpu, live: list[GpuLease]) -> GpuStatus:
    held = sum(lease.memory_bytes for lease in live)
    return GpuStatus(
        host=row.host, index=row.index, uuid=row.uuid, name=row.name,
        memory_total_bytes=row.memory_total_bytes, memory_free_bytes=row.memory_free_bytes,
        memory_unleased_bytes=max(0, row.memory_total_bytes - held),
        healthy=row.healthy, health_reason=row.health_reason, updated_at=row.updated_at,
        leases=[GpuLeaseStatus(job_id=x.job_id, exclusive=x.exclusive, memory_bytes=x.memory_bytes,
                               heartbeat_at=x.heartbeat_at, expires_at=x.expires_at) for x in live],
    )


def _unreported_status(host: str, info: GpuInfo) -> GpuStatus:
    return GpuStatus(host=host, index=info.index, uuid=info.uuid, name=info.name,
                     memory_total_bytes=info.memory_total_bytes, memory_free_bytes=info.memory_free_bytes,
                     memory_unleased_bytes=info.memory_total_bytes, healthy=info.healthy,
                     health_reason=info.health_reason, updated_at=None, leases=[])


class NvmlSampler:
    """GPU memory the given processes use right now, as NVML sees it (None where there is no NVML)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:  # no library or no driver: a CPU box
            self._nvml = None

    def used_bytes(self, pids: set[int]) -> int | None:
        nv = self._nvml
        if nv is None or not pids:
            return None
        total, seen = 0, False
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                for proc in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i)):
                    if proc.pid in pids and proc.usedGpuMemory is not None:
                        total, seen = total + int(proc.usedGpuMemory), True
        except nv.NVMLError:
            return None
        return total if seen else None

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None
