"""The box probe: what this box's GPUs and host do, measured once per set of GPUs, driver, torch and
DeepSpeed version, and stored per box (``box_probes``) for every plan made for it.

It measures, in a child process (``python -m tunebox.probe``) so the worker never holds a CUDA
context of its own: the memory a training process has outside PyTorch's allocator (CUDA context
and cuBLAS workspaces, then NCCL's communicator), as NVML sees it; the bf16 matmul rate at a 7B
model's MLP shape; pinned host-to-device and device-to-host copies; DeepSpeed's CPU Adam rate on
this host's cores; the host's free RAM and the free disk where NVMe offload points. A figure that
cannot be measured is left out with its reason; a probe that crashes or runs past
``box_probe_timeout_s`` is stored as failed, and plans fall back to the GPU catalogue, then the
settings.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from sqlalchemy import select

from store.db import session_scope
from store.models import BoxProbe

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from tunebox.settings import Settings

__all__ = [
    "BoxProbeStatus",
    "ProbeOutcome",
    "box_identity",
    "latest_probe",
    "list_box_probes",
    "probe_box",
    "probe_key",
    "run_probe",
]

log = logging.getLogger(__name__)

#: Bumped when the probe measures differently: old rows are then probed again.
PROBE_VERSION = 1
#: The matmul the rate is timed on: two sequences of 4096 tokens through a 7B model's MLP projection.
MATMUL_SHAPE = (8192, 4096, 11008)
#: Bytes of one timed host<->device copy.
COPY_BYTES = 256 * 2**20
#: Parameters of the timed CPU Adam step.
ADAM_ELEMENTS = 2**24


# --------------------------------------------------------------------------- identity (no CUDA)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _nvml_identity() -> tuple[list[dict[str, str]], str | None]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver: a box without NVIDIA GPUs
        return [], None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append(
                {
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                }
            )
        return gpus, driver
    except Exception:
        return [], None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def box_identity() -> dict[str, Any]:
    """What the probe's figures depend on: the GPUs (by UUID), the driver, torch and DeepSpeed."""
    gpus, driver = _nvml_identity()
    return {
        "gpus": sorted(gpus, key=lambda g: g["uuid"]),
        "driver": driver,
        "torch": _version("torch"),
        "deepspeed": _version("deepspeed"),
        "probe_version": PROBE_VERSION,
    }


def probe_key(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- the parent's side


@dataclass
class ProbeOutcome:
    status: str  # ok | failed
    error: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)


def _extensions_dir(settings: Settings) -> Path:
    return settings.torch_extensions_dir or settings.data_dir / "torch_extensions"


def run_probe(settings: Settings, identity: dict[str, Any]) -> ProbeOutcome:
    """Run the probe child and read its figures; any failure is an outcome, never an exception."""
    nvme_dir = settings.nvme_path or settings.data_dir
    cmd = [sys.executable, "-m", settings.box_probe_module, "--nvme-dir", str(nvme_dir)]
    if identity["gpus"]:
        cmd.append("--cpu-adam")  # the worker builds DeepSpeed's CPU Adam for its jobs anyway
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(_extensions_dir(settings))}
    timeout = settings.box_probe_timeout_s
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
    except OSError as exc:
        return ProbeOutcome("failed", f"could not start the probe: {exc}")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started (an op build)
        proc.communicate()
        return ProbeOutcome("failed", f"the probe ran past {timeout:g} s and was stopped")
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["no output"])[-1]
        return ProbeOutcome("failed", f"the probe exited with status {proc.returncode}: {last[:500]}")
    try:
        result = json.loads(out.strip().splitlines()[-1])
        figures = dict(result["figures"])
        figures["errors"] = dict(result.get("errors", {}))
    except (IndexError, ValueError, KeyError, TypeError):
        return ProbeOutcome("failed", "the probe printed no result")
    return ProbeOutcome("ok", None, figures)


def _no_gpu_outcome(settings: Settings) -> ProbeOutcome:
    """A box where NVML sees no GPU: the host's figures, measured here (no torch needed)."""
    try:
        figures = _host_figures(str(settings.nvme_path or settings.data_dir))
    except Exception as exc:
        return ProbeOutcome("failed", f"{type(exc).__name__}: {exc}")
    figures["errors"] = {"gpu": "NVML sees no GPU: the settings describe this box's GPUs"}
    return ProbeOutcome("ok", None, figures)


def latest_probe(session: Session, host: str) -> BoxProbe | None:
    """The newest probe of ``host``, failed or not."""
    query = (
        select(BoxProbe).where(BoxProbe.host == host).order_by(BoxProbe.updated_at.desc(), BoxProbe.id.desc())
    )
    return session.scalars(query.limit(1)).first()


def probe_box(settings: Settings, identity: dict[str, Any] | None = None) -> BoxProbe | None:
    """This box's probe: the stored one where GPUs, driver, torch and DeepSpeed (``identity``; this
    box's where None) are unchanged and it succeeded; else measured now (the database is not held
    meanwhile) and stored."""
    if not settings.box_probe:
        return None
    from tunebox.gpus import host_name

    host = host_name(settings)
    identity = identity if identity is not None else box_identity()
    key = probe_key(identity)
    url = settings.resolved_database_url
    with session_scope(url) as s:
        row = s.scalars(select(BoxProbe).where(BoxProbe.host == host, BoxProbe.probe_key == key)).first()
        if row is not None and row.status == "ok":
            s.expunge(row)
            return row
    started = time.monotonic()
    outcome = run_probe(settings, identity) if identity["gpus"] else _no_gpu_outcome(settings)
    if outcome.status == "ok":
        outcome.figures["seconds"] = round(time.monotonic() - started, 2)
    else:
        log.warning(
            "box probe failed, plans fall back to the GPU catalogue and the settings: %s", outcome.error
        )
    with session_scope(url) as s:
        row = s.scalars(select(BoxProbe).where(BoxProbe.host == host, BoxProbe.probe_key == key)).first()
        if row is None:
            row = BoxProbe(host=host, probe_key=key)
            s.add(row)
        row.identity, row.status, row.error, row.figures = (
            identity,
            outcome.status,
            outcome.error,
            outcome.figures,
        )
        s.flush()
        s.expunge(row)
        return row


# --------------------------------------------------------------------------- the child's side


def _host_figures(nvme_dir: str) -> dict[str, Any]:
    import psutil

    figures: dict[str, Any] = {
        "host_memory_available_bytes": int(psutil.virtual_memory().available),
        "host_cpu_count": os.cpu_count(),
    }
    usage = shutil.disk_usage(nvme_dir)
    figures.update(nvme_dir=nvme_dir, nvme_free_bytes=int(usage.free))
    return figures


def _nvml_process_bytes(index: int) -> int | None:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
        return None
    finally:
        pynvml.nvmlShutdown()


def _best_seconds(torch: Any, fn: Any, repeats: int, inner: int) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def _matmul_tflops(torch: Any) -> float:
    m, k, n = MATMUL_SHAPE
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    seconds = _best_seconds(torch, lambda: torch.matmul(a, b, out=out), repeats=5, inner=20)
    return round(2.0 * m * k * n / seconds / 1e12, 2)


def _copy_gbps(torch: Any) -> dict[str, float]:
    host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    h2d = _best_seconds(torch, lambda: gpu.copy_(host, non_blocking=True), repeats=5, inner=1)
    d2h = _best_seconds(torch, lambda: host.copy_(gpu, non_blocking=True), repeats=5, inner=1)
    return {
        "h2d_pinned_gbps": round(COPY_BYTES / h2d / 1e9, 2),
        "d2h_pinned_gbps": round(COPY_BYTES / d2h / 1e9, 2),
    }


def _nccl_bytes(torch: Any, outside_before: int) -> int | None:
    import tempfile

    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)  # type: ignore[attr-defined]
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
        try:
            x = torch.ones(1024, device="cuda")
            dist.all_reduce(x)
            torch.cuda.synchronize()
            used = _nvml_process_bytes(0)
            return None if used is None else used - torch.cuda.memory_reserved() - outside_before
        finally:
            dist.destroy_process_group()


def _gpu_figures(errors: dict[str, str]) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        errors["gpu"] = "no CUDA device"
        return {}
    figures: dict[str, Any] = {"gpu_name": torch.cuda.get_device_name(0), "torch_cuda": torch.version.cuda}
    for name, measure in (
        ("matmul_tflops", lambda: _matmul_tflops(torch)),
        ("copies", lambda: _copy_gbps(torch)),
    ):
        try:
            value = measure()
            figures.update(value if isinstance(value, dict) else {name: value})
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    try:
        used = _nvml_process_bytes(0)
        if used is None:
            raise RuntimeError("NVML lists no memory for this process")
        outside = used - torch.cuda.memory_reserved()
        figures["cuda_context_bytes"] = outside
        nccl = _nccl_bytes(torch, outside)
        if nccl is not None:
            figures["nccl_bytes"] = nccl
    except Exception as exc:
        errors["cuda_context_bytes"] = f"{type(exc).__name__}: {exc}"
    return figures


def _cpu_adam_elements_per_s() -> float:
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    param = torch.nn.Parameter(torch.zeros(ADAM_ELEMENTS))
    param.grad = torch.randn(ADAM_ELEMENTS)
    opt = DeepSpeedCPUAdam([param], lr=1e-4)
    opt.step()  # warm-up (and the op's build where it is not cached)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    return round(ADAM_ELEMENTS / best, 0)


def measure(nvme_dir: str, cpu_adam: bool) -> dict[str, Any]:
    """Every figure this process can measure, and why each missing one is missing."""
    errors: dict[str, str] = {}
    figures: dict[str, Any] = {}
    parts: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("host", lambda: _host_figures(nvme_dir)),
        ("gpu", lambda: _gpu_figures(errors)),
    ]
    for name, part in parts:
        try:
            figures.update(part())
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    if cpu_adam:
        try:
            figures["cpu_adam_elements_per_s"] = _cpu_adam_elements_per_s()
        except Exception as exc:
            errors["cpu_adam_elements_per_s"] = f"{type(exc).__name__}: {exc}"
    return {"figures": figures, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvme-dir", default=".")
    parser.add_argument("--cpu-adam", action="store_true", help="time DeepSpeed's CPU Adam (builds the op)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.nvme_dir, args.cpu_adam)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


class BoxProbeStatus(BaseModel):
    """One box's latest probe for ``GET /v1/gpus``."""

    host: str
    status: str  # ok | failed
    error: str | None
    identity: dict[str, Any]
    figures: dict[str, Any]
    #: what plans for this box take from the probe, in the planner's terms (hardware fields)
    planned_from_probe: dict[str, float]
    updated_at: datetime


def list_box_probes(session: Session) -> list[BoxProbeStatus]:
    from tunebox.gpus import probed_rates

    hosts = sorted(set(session.scalars(select(BoxProbe.host).distinct())))
    out = []
    for host in hosts:
        row = latest_probe(session, host)
        assert row is not None
        out.append(
            BoxProbeStatus(
                host=host,
                status=row.status,
                error=row.error,
                identity=row.identity,
                figures=row.figures,
                planned_from_probe=probed_rates(session, host),
                updated_at=row.updated_at,
            )
        )
    return out
