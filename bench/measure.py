"""Measure real DeepSpeed training steps for the benchmark matrix and record what the GPU shows.

One invocation runs many cases inside a wall-clock budget. Each case runs in fresh processes (one
per rank) so its peaks are its own and a crash or OOM cannot take the others down; this parent
samples NVML and host RSS from outside while it runs and appends one JSON line per case to
``--out`` the moment it ends. See bench/README.md for the commands and the record schema.

Usage (from the repository root):
    python -m bench.measure --list
    python -m bench.measure --budget-seconds 540 --resume --out bench/results/h200-x1.jsonl

The module imports no torch at top level: the parent stays small and the children, started as
``python -m bench.measure --child ...``, import the training stack.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: make ``bench`` and ``planner`` importable
    sys.path.insert(0, str(REPO))

from bench.cases import HOST_MEMORY_PER_GPU_BYTES, MATRICES, Case  # noqa: E402

# NVLink multicast must stay off on the shared multi-GPU hosts; children get these whatever the
# caller's environment says.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
SAMPLE_INTERVAL_S = 0.02
RSS_EVERY_N_SAMPLES = 5
RANK_GRACE_S = 15.0      # after one rank fails, how long the others get to notice before being killed
ERROR_TAIL_LINES = 40
WARMUP_OPTIMIZER_STEPS = 2
#: Steps timed phase by phase after the measured ones (``measured.phase_seconds``).
PHASE_STEPS = 2
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED",
               "out of memory", "NCCL WARN Cuda failure 'out of memory'")


# --------------------------------------------------------------------------- DeepSpeed config


def build_ds_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config the service runs ``spec`` with: the plan's own (``planner.dsconfig``), so
    a case measures the configuration users get. Every choice of the case must be concrete."""
    return dict(plan_case(spec).deepspeed_config)


def plan_case(spec: dict[str, Any]) -> Any:
    """The plan of a case, whose every choice must be concrete."""
    from planner import plan

    tr, res = spec["training"], spec["resources"]
    for key, value in (("micro_batch_size", tr.get("micro_batch_size")),
                       ("gradient_checkpointing", tr.get("gradient_checkpointing")),
                       ("num_gpus", res.get("num_gpus")), ("zero_stage", res.get("zero_stage")),
                       ("offload_optimizer", res.get("offload_optimizer")),
                       ("offload_param", res.get("offload_param"))):
        if value in (None, "auto"):
            raise ValueError(f"a benchmark case needs a concrete {key} (got {value!r})")
    off_opt, off_param = res["offload_optimizer"], res["offload_param"]
    if "nvme" in (off_opt, off_param):
        raise ValueError("NVMe offload is not part of the benchmark")
    if int(res["zero_stage"]) == 0 and "cpu" in (off_opt, off_param):
        raise ValueError("offload needs ZeRO stage 1-3")
    if off_param == "cpu" and int(res["zero_stage"]) != 3:
        raise ValueError("parameter offload needs ZeRO-3")
    return plan(spec)


# --------------------------------------------------------------------------- the job a case runs

#: model folders kept on the disk at once (a 7B model in bf16 is 15 GB)
MODEL_FOLDERS_KEPT = 2
#: rows of the case's dataset; each is longer than any case's sequence, so every row the trainer
#: draws is one whole example of seq_len tokens (no padding, no packed rows and so no mask)
DATASET_ROWS = 64
DATASET_WORDS = 12_000


@dataclass(frozen=True)
class ModelFolder:
    path: Path | None
    error: str | None = None
    timed_out: bool = False


def model_folder(config: dict[str, Any], work: Path, limit_s: float) -> ModelFolder:
    """A folder holding a random-init model of ``config`` and the bench's tokenizer, saved the way a
    real one is (``--build-model``, in a child on the training device), for the trainer to load as
    it loads a job's model; kept for the cases after it."""
    import hashlib

    from bench.service_gpu import is_saved_model

    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    root = work / "models"
    dest = root / key
    if is_saved_model(dest):
        os.utime(dest)
        return ModelFolder(dest)
    kept = sorted((p for p in root.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime) \
        if root.exists() else []
    for old in kept[:max(0, len(kept) - MODEL_FOLDERS_KEPT + 1)]:
        shutil.rmtree(old, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    spec_file, log = root / f"{key}.json", root / f"{key}.log"
    spec_file.write_text(json.dumps(config))
    proc = _start_helper(["--build-model", str(spec_file), "--dest", str(dest)], log)
    timed_out = _wait_helper(proc, limit_s)
    if proc.returncode != 0 or not (dest / "config.json").exists():
        shutil.rmtree(dest, ignore_errors=True)
        failed = f"building the model failed (rc {proc.returncode}):\n{_tail(log)}"
        return ModelFolder(None, failed, timed_out)
    return ModelFolder(dest)


def case_dataset(work: Path) -> Path:
    """The dataset every case trains on (text rows, as a user's: the trainer tokenizes them)."""
    from bench.service_gpu import build_dataset

    path = work / "data" / "rows.jsonl"
    if not path.exists():
        build_dataset(path, rows=DATASET_ROWS, words=DATASET_WORDS)
    return path


def write_run(job_dir: Path, job_id: str, spec: dict[str, Any], model: Path, data: Path, plan: Any,
              ds_config: dict[str, Any], device: str, gpu_limit: int | None) -> None:
    """A run.json as the worker writes a job's from its stored spec and plan
    (``worker.launcher.build_run_file``), the spec naming the model folder and the data."""
    from worker._trainlib.runfile import write_json_atomic

    spec = {**spec, "model": {"path": str(model)}, "dataset": {"path": str(data)}}
    job_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(job_dir / "run.json", {
        "job_id": job_id, "spec": spec, "model_path": str(model), "dataset_path": str(data),
        "eval_dataset_path": "", "resolved": plan.resolved.model_dump(), "deepspeed_config": ds_config,
        "device": device, "gpu_memory_limit_bytes": gpu_limit})


def _case_spec(case: Case, steps: int) -> dict[str, Any]:
    """The case's spec as its job trains it: for the steps the harness takes, no evaluation."""
    spec = json.loads(json.dumps(case.spec))
    spec["training"]["max_steps"] = steps
    spec["training"].pop("epochs", None)
    spec["eval"] = {"when": "none"}
    return spec


# --------------------------------------------------------------------------- parent: discovery


@dataclass
class Gpus:
    """NVML handles of every GPU on the machine (empty where NVML is unavailable)."""

    nvml: Any = None
    handles: list[Any] = field(default_factory=list)
    name: str | None = None
    memory_bytes: int | None = None
    driver: str | None = None

    @classmethod
    def discover(cls) -> Gpus:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return cls()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if not handles:
            return cls(nvml=pynvml)
        name = pynvml.nvmlDeviceGetName(handles[0])
        return cls(nvml=pynvml, handles=handles,
                   name=name.decode() if isinstance(name, bytes) else str(name),
                   memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handles[0]).total),
                   driver=_decode(pynvml.nvmlSystemGetDriverVersion()))

    def used(self) -> list[int]:
        return [int(self.nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self.handles]


def _decode(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _host_memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


# --------------------------------------------------------------------------- parent: sampling


class Sampler(threading.Thread):
    """Peaks of NVML per-process and device memory per GPU, and of the case's host RSS."""

    def __init__(self, gpus: Gpus, root_pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.gpus, self.root_pids = gpus, root_pids
        n = len(gpus.handles)
        self.peak_proc = [0] * n          # our processes' usedGpuMemory, per GPU
        self.peak_all_procs = [0] * n     # every compute process (fallback when pids do not match)
        self.peak_used = [0] * n
        self.pid_matched = False
        self.saw_processes = False
        self.proc_figure_available = False
        self.peak_rss = 0
        self._stop_event = threading.Event()
        self._procs: dict[int, Any] = {}
        self._procs_at = 0.0

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)

    def run(self) -> None:
        i = 0
        while not self._stop_event.is_set():
            pids = self._tree()
            if self.gpus.handles:
                self._sample_gpus(pids)
            if i % RSS_EVERY_N_SAMPLES == 0:
                self._sample_rss()
            i += 1
            self._stop_event.wait(SAMPLE_INTERVAL_S)

    def _tree(self) -> set[int]:
        import psutil

        now = time.monotonic()
        if now - self._procs_at > 0.5:
            found: dict[int, Any] = {}
            for pid in self.root_pids:
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(pid)
                    for p in [root, *root.children(recursive=True)]:
                        found[p.pid] = self._procs.get(p.pid, p)
            self._procs, self._procs_at = found, now
        return set(self._procs)

    def _sample_gpus(self, pids: set[int]) -> None:
        nvml = self.gpus.nvml
        for g, h in enumerate(self.gpus.handles):
            with contextlib.suppress(nvml.NVMLError):
                self.peak_used[g] = max(self.peak_used[g], int(nvml.nvmlDeviceGetMemoryInfo(h).used))
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
            except nvml.NVMLError:
                continue
            mine = every = 0
            for p in procs:
                mem = p.usedGpuMemory
                self.saw_processes = True
                if mem is None:
                    continue
                self.proc_figure_available = True
                every += int(mem)
                if p.pid in pids:
                    self.pid_matched = True
                    mine += int(mem)
            self.peak_proc[g] = max(self.peak_proc[g], mine)
            self.peak_all_procs[g] = max(self.peak_all_procs[g], every)

    def _sample_rss(self) -> None:
        import psutil

        total = 0
        for p in list(self._procs.values()):
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        self.peak_rss = max(self.peak_rss, total)

    def nvml_figures(self, baseline: list[int]) -> dict[str, Any]:
        if not self.gpus.handles:
            return {"nvml_peak_bytes": None, "nvml_device_peak_bytes": None,
                    "nvml_peak_bytes_per_gpu": None, "nvml_source": None}
        if self.pid_matched:
            per_gpu, source = self.peak_proc, "pid"
        elif self.saw_processes and self.proc_figure_available:
            # The pids NVML reports live in another pid namespace: on a machine of our own the
            # only compute processes are the case's.
            per_gpu, source = self.peak_all_procs, "all_processes"
        else:
            per_gpu, source = None, None
        device = [max(0, u - b) for u, b in zip(self.peak_used, baseline, strict=True)]
        return {"nvml_peak_bytes": max(per_gpu) if per_gpu else None,
                "nvml_device_peak_bytes": max(device),
                "nvml_peak_bytes_per_gpu": per_gpu, "nvml_source": source}


# --------------------------------------------------------------------------- parent: one case


@dataclass
class RankRun:
    rank: int
    proc: subprocess.Popen[bytes]
    log: Path
    result: Path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ALLOC_TRACE_ENV = "TUNEBOX_BENCH_ALLOC_TRACE"


def _child_env(rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(MULTICAST_OFF)
    env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    if "TORCH_CUDA_ARCH_LIST" in env:
        # DeepSpeed's op builder cannot parse arch-specific targets such as "9.0a".
        env["TORCH_CUDA_ARCH_LIST"] = re.sub(r"(\d+\.\d+)a\b", r"\1", env["TORCH_CUDA_ARCH_LIST"])
    return env


def _spawn_ranks(case_file: Path, world: int, case_dir: Path) -> list[RankRun]:
    port = _free_port()
    runs = []
    for rank in range(world):
        log, result = case_dir / f"rank{rank}.log", case_dir / f"rank{rank}.json"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.measure", "--child", str(case_file), "--rank", str(rank),
                 "--result", str(result)],
                cwd=REPO, env=_child_env(rank, world, port), stdout=fh, stderr=subprocess.STDOUT,
                start_new_session=True)
        runs.append(RankRun(rank, proc, log, result))
    return runs


def _kill(runs: list[RankRun]) -> None:
    for r in runs:
        if r.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.proc.pid, signal.SIGKILL)
    for r in runs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            r.proc.wait(timeout=10)


def _wait(runs: list[RankRun], limit_s: float) -> str | None:
    """Wait for every rank; returns "timeout" if the limit hit, else None. Kills stragglers."""
    deadline = time.monotonic() + limit_s
    failed_at: float | None = None
    while True:
        codes = [r.proc.poll() for r in runs]
        if all(c is not None for c in codes):
            return None
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if failed_at is not None and now - failed_at > RANK_GRACE_S:
            _kill(runs)
            return None
        if now > deadline:
            _kill(runs)
            return "timeout"
        time.sleep(0.1)


def _tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # Long lines (a list of every known architecture, say) are cut so the start, which names the
    # problem, survives.
    kept = [ln if len(ln) <= 400 else ln[:400] + " ..." for ln in text.strip().splitlines()[-lines:]]
    return "\n".join(kept)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _classify(runs: list[RankRun], results: list[dict[str, Any] | None], timed_out: bool,
              budget_clamped: bool, limit_s: float) -> tuple[str, str | None]:
    statuses = [r.get("status") if r else None for r in results]
    if "oom" in statuses:
        bad = statuses.index("oom")
        return "oom", _tail(runs[bad].log)
    if timed_out:
        why = "budget: the wall-clock budget ran out" if budget_clamped else "timeout"
        return "timeout", f"{why} after {limit_s:.0f} s\n{_tail(runs[0].log)}"
    if all(s == "ok" for s in statuses) and all(r.proc.returncode == 0 for r in runs):
        return "ok", None
    for run, res in zip(runs, results, strict=True):
        if res and res.get("status") == "ok" and run.proc.returncode == 0:
            continue
        tail = _tail(run.log)
        if run.proc.returncode == -signal.SIGKILL and not res:
            return "oom", f"host: rank {run.rank} was killed by SIGKILL (the kernel OOM killer?)\n{tail}"
        if any(m in tail for m in OOM_MARKERS):
            return "oom", tail
        return "error", tail or f"rank {run.rank} exited with {run.proc.returncode}"
    return "error", "no rank reported a result"


def _merge_measured(results: list[dict[str, Any] | None], sampler: Sampler,
                    baseline: list[int], spec: dict[str, Any]) -> dict[str, Any]:
    got = [r for r in results if r]
    tr = spec["training"]

    def mx(key: str) -> int | None:
        vals = [r[key] for r in got if r.get(key) is not None]
        return max(vals) if vals else None

    steps = next((r.get("step_seconds") for r in got if r.get("rank") == 0 and r.get("step_seconds")), None)
    step_s = statistics.median(steps) if steps else None
    tokens = tr["micro_batch_size"] * tr["seq_len"] * tr.get("gradient_accumulation_steps", 1) \
        * spec["resources"]["num_gpus"]
    phase_keys = ("after_init_allocated", "forward_backward_allocated_peak", "optimizer_step_allocated_peak")
    phases = {k: max((r["phase_peaks"][k] for r in got if (r.get("phase_peaks") or {}).get(k) is not None),
                     default=None) for k in phase_keys}
    rss = [r["ru_maxrss_bytes"] for r in got if r.get("ru_maxrss_bytes")]
    rank0 = next((r for r in got if r.get("rank") == 0), {})
    by_rank = sorted(got, key=lambda r: r.get("rank", 0))
    return {
        **sampler.nvml_figures(baseline),
        "torch_max_allocated_bytes": mx("torch_max_allocated_bytes"),
        "torch_max_reserved_bytes": mx("torch_max_reserved_bytes"),
        "host_peak_rss_bytes": sum(rss) if rss else None,
        "host_peak_rss_sampled_bytes": sampler.peak_rss or None,
        "step_seconds": step_s,
        "tokens_per_second": tokens / step_s if step_s else None,
        "phase_peaks": phases,
        "step_seconds_all": steps,
        # forward, backward and optimizer-step seconds of each phase-timed step (rank 0)
        "phase_seconds": rank0.get("phase_seconds"),
        # the host's hooked-module time read by each rank's process before DeepSpeed was imported
        "case_host_probes": [r.get("host_probe") for r in by_rank],
        "init_seconds": rank0.get("init_seconds"),
        "param_count": rank0.get("param_count"),
        "trainable_param_count": rank0.get("trainable_param_count"),
        "loss": rank0.get("loss"),
        "partitioned_at_init": rank0.get("partitioned_at_init"),
        "attn_implementation": rank0.get("attn_implementation"),
        "host_phases": [r.get("host_phases") or {} for r in by_rank],
        "allocator_retries": mx("allocator_retries"),
        # torch's allocated peak of each warm-up micro-step and each measured optimizer step, on
        # the busiest rank: a first step that peaks above the rest shows here
        "step_allocated_peaks": _busiest_steps(got),
    }


def _busiest_steps(got: list[dict[str, Any]]) -> dict[str, list[int | None]] | None:
    """The per-step allocated peaks of the rank whose highest step is highest."""
    per_rank = [r["step_allocated_peaks"] for r in got if r.get("step_allocated_peaks")]

    def highest(steps: dict[str, list[int | None]]) -> int:
        return max((v for v in steps["warmup_micro_steps"] + steps["measured_steps"] if v), default=0)

    return max(per_rank, key=highest) if per_rank else None


@dataclass(frozen=True)
class MemoryLimit:
    """How each rank's PyTorch allocator is limited. ``none``: not at all, as the service runs a job
    on cards it holds alone (the natural peak, which the planner predicts); ``plan``: to the plan's
    ``per_gpu.allocator_limit_bytes``. ``slack_share`` below 1 keeps only that share of the planned
    allocator slack in the limit (an experiment: how much of the slack a limited run needs)."""

    mode: str = "none"
    slack_share: float = 1.0

    def limit_bytes(self, spec: dict[str, Any]) -> int | None:
        if self.mode == "none":
            return None
        from planner import plan

        per_gpu = plan(spec).per_gpu
        return int(per_gpu.allocator_limit_bytes - (1.0 - self.slack_share) * per_gpu.allocator_slack_bytes)

    def describe(self, limit: int | None) -> dict[str, Any]:
        return {"mode": self.mode, "slack_share": self.slack_share, "limit_bytes": limit}


def run_case(case: Case, env: dict[str, Any], gpus: Gpus, work: Path, limit_s: float,
             budget_clamped: bool, warmup_steps: int, memory: MemoryLimit = MemoryLimit(),
             phase_steps: int = 0) -> dict[str, Any]:
    t0 = time.monotonic()
    spec = case.spec
    record: dict[str, Any] = {"case": case.name, "spec": spec, "deepspeed_config": None, "status": "error",
                              "error": None, "measured": None, "env": env, "wall_seconds": None}
    try:
        _validate(spec)
        planned = plan_case(spec)
        ds_config = dict(planned.deepspeed_config)
        gpu_limit = memory.limit_bytes(spec) if gpus.handles else None
        record["gpu_memory_limit"] = memory.describe(gpu_limit)
    except Exception as exc:  # an invalid case is a recorded error, not a stopped run
        record.update(error=f"invalid case: {exc}", wall_seconds=round(time.monotonic() - t0, 3))
        return record
    record["deepspeed_config"] = ds_config
    slug = re.sub(r"[^A-Za-z0-9.=+-]+", "_", case.name)[:120]
    case_dir = Path(tempfile.mkdtemp(prefix=f"{slug}-", dir=work))
    model = model_folder(spec["model"]["config"], work, limit_s)
    if model.path is None:
        status, error = "error", model.error
        if model.timed_out:
            why = "budget: the wall-clock budget ran out" if budget_clamped else "timeout"
            status, error = "timeout", f"{why} after {limit_s:.0f} s, {model.error}"
        record.update(status=status, error=error, wall_seconds=round(time.monotonic() - t0, 3))
        return record
    job_dir = case_dir / "job"
    write_run(job_dir, slug, _case_spec(case, warmup_steps + case.measured_steps + phase_steps), model.path,
              case_dataset(work), planned, ds_config, "cuda" if gpus.handles else "cpu", gpu_limit)
    case_file = case_dir / "case.json"
    case_file.write_text(json.dumps({"name": case.name, "job_dir": str(job_dir), "warmup_steps": warmup_steps,
                                     "measured_steps": case.measured_steps, "phase_steps": phase_steps}))
    baseline = gpus.used() if gpus.handles else []
    runs = _spawn_ranks(case_file, int(spec["resources"]["num_gpus"]), case_dir)
    sampler = Sampler(gpus, [r.proc.pid for r in runs])
    sampler.start()
    try:
        timed_out = _wait(runs, limit_s) == "timeout"
    finally:
        _kill(runs)
        sampler.stop()
    results = [_read_json(r.result) for r in runs]
    _fill_versions(env, results)
    status, error = _classify(runs, results, timed_out, budget_clamped, limit_s)
    record.update(status=status, error=error,
                  measured=_merge_measured(results, sampler, baseline, spec),
                  wall_seconds=round(time.monotonic() - t0, 3))
    return record


def _fill_versions(env: dict[str, Any], results: list[dict[str, Any] | None]) -> None:
    """Versions the children saw, where the parent has none yet (no prebuild step ran)."""
    seen: dict[str, Any] = next((r["versions"] for r in results if r and r.get("versions")), {})
    for key, value in seen.items():
        if env.get(key) is None:
            env[key] = value


def _validate(spec: dict[str, Any]) -> None:
    try:
        from planner.spec import JobSpec
    except ImportError as exc:  # a GPU image without the service's dependencies still measures
        print(f"  warning: cases not validated as JobSpec ({exc})", flush=True)
        return
    JobSpec.model_validate(spec)


def with_machine_hardware(case: Case, gpus: Gpus, host_memory_bytes: int | None) -> Case:
    """The case as run here: its hardware block describes this machine's GPUs."""
    if not gpus.handles:
        return case
    spec = json.loads(json.dumps(case.spec))
    hw = spec.setdefault("hardware", {})
    hw.update(gpu_count=len(gpus.handles), gpu_memory_bytes=gpus.memory_bytes, gpu_name=gpus.name,
              host_memory_bytes=host_memory_bytes or HOST_MEMORY_PER_GPU_BYTES * len(gpus.handles))
    return Case(name=case.name, spec=spec, est_seconds=case.est_seconds,
                measured_steps=case.measured_steps, group=case.group, expect=case.expect)


# --------------------------------------------------------------------------- parent: ops + env


def _needed_ops(cases: list[Case]) -> list[str]:
    res = [c.spec["resources"] for c in cases]
    ops = ["ShareMemCommBuilder"]  # the CPU backend builds it at init_distributed; skipped on CUDA
    if any(r.get("offload_optimizer") == "cpu" for r in res):
        ops.append("CPUAdamBuilder")
    if any(r.get("offload_optimizer") != "cpu" for r in res):
        ops.append("FusedAdamBuilder")
    return ops


def _start_helper(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``python -m bench.measure ARGS`` as a one-GPU child in its own session, output to ``log``."""
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "bench.measure", *args], cwd=REPO,
                                env=_child_env(0, 1, _free_port()), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_helper(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait for a helper; True where it ran out of time and was killed."""
    try:
        proc.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True


def prebuild(ops: list[str], work: Path, limit_s: float) -> dict[str, Any]:
    """Build (or load from TORCH_EXTENSIONS_DIR) each op in parallel processes; return versions."""
    procs = []
    for op in ops:
        out = work / f"prebuild-{op}.json"
        log = work / f"prebuild-{op}.log"
        procs.append((op, out, log, _start_helper(["--prebuild", op, "--result", str(out)], log)))
    versions: dict[str, Any] = {}
    deadline = time.monotonic() + limit_s
    for op, out, log, proc in procs:
        _wait_helper(proc, max(1.0, deadline - time.monotonic()))
        info = _read_json(out)
        if info is None:
            print(f"  prebuild {op}: FAILED (rc {proc.returncode})\n{_tail(log, 15)}", flush=True)
            continue
        print(f"  prebuild {op}: {info['state']} in {info['seconds']:.0f} s", flush=True)
        versions = versions or info["versions"]
    return versions


def host_probe(work: Path, limit_s: float) -> dict[str, Any] | None:
    """This host's speed at what sets the host clock of a step, measured once per run in a child
    (``--probe``): a pure-Python loop, a small tensor op's dispatch on the training device, and a
    module call through two Python hooks (what ZeRO-3 adds to every module). Sessions on the same
    kind of machine differ in step time; these figures say whether the host is why."""
    out, log = work / "probe.json", work / "probe.log"
    proc = _start_helper(["--probe", "--result", str(out)], log)
    _wait_helper(proc, limit_s)
    probe = _read_json(out)
    if probe is None:
        print(f"  host probe: FAILED (rc {proc.returncode})\n{_tail(log, 15)}", flush=True)
        return None
    print("  host probe: " + ", ".join(f"{k} {v}" for k, v in probe.items()), flush=True)
    return probe


def probe_main(result: Path) -> int:
    import torch

    from tunebox.hostclock import probe

    result.write_text(json.dumps(probe("cuda" if torch.cuda.is_available() else "cpu")))
    return 0


def env_info(gpus: Gpus, versions: dict[str, Any]) -> dict[str, Any]:
    return {"gpu_name": gpus.name, "gpu_memory_bytes": gpus.memory_bytes, "gpu_count": len(gpus.handles),
            "torch": versions.get("torch"), "cuda": versions.get("cuda"),
            "deepspeed": versions.get("deepspeed"), "transformers": versions.get("transformers"),
            "peft": versions.get("peft"), "host_memory_bytes": _host_memory_bytes(),
            "driver": gpus.driver, "python": sys.version.split()[0],
            "accelerator": versions.get("accelerator"),
            "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(),
            # the training program the cases ran: the service's trainer
            "trainer": "worker.train"}


def _cpu_model() -> str | None:
    """The host CPU's model name: ZeRO-3's host clock and the CPU optimizer run at its speed."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


# --------------------------------------------------------------------------- parent: main


def load_cases(cases_file: str | None, matrix: str = "main") -> list[Case]:
    if cases_file is None:
        return list(MATRICES[matrix])
    return [Case.from_json(d) for d in json.loads(Path(cases_file).read_text())]


def done_cases(out: Path) -> set[str]:
    """Cases with a final record; a case stopped because the budget ran out is not final."""
    done: set[str] = set()
    if not out.exists():
        return done
    for line in out.read_text().splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            rec = json.loads(line)
            budget_stop = rec["status"] == "timeout" and str(rec.get("error") or "").startswith("budget")
            if not budget_stop:
                done.add(rec["case"])
    return done


def default_out(gpus: Gpus) -> Path:
    hw = re.sub(r"[^a-z0-9]+", "-", (gpus.name or "cpu").lower()).strip("-")
    return REPO / "bench" / "results" / f"{hw}-x{max(1, len(gpus.handles))}-{_dt.date.today():%Y-%m-%d}.jsonl"


def append_record(out: Path, record: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as fh:
        fh.write(json.dumps(record, sort_keys=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _gb(v: Any) -> str:
    return f"{v / 1e9:6.2f}" if isinstance(v, (int, float)) else "     -"


def progress_line(i: int, n: int, elapsed: float, rec: dict[str, Any], est: float) -> str:
    m = rec.get("measured") or {}
    step = m.get("step_seconds")
    tps = m.get("tokens_per_second")
    return (f"[{i:2d}/{n} {elapsed:5.0f}s] {rec['status']:7s} nvml {_gb(m.get('nvml_peak_bytes'))} GB"
            f" dev {_gb(m.get('nvml_device_peak_bytes'))} alloc {_gb(m.get('torch_max_allocated_bytes'))}"
            f" limit {_gb((rec.get('gpu_memory_limit') or {}).get('limit_bytes'))}"
            f" retries {m.get('allocator_retries')}"
            f" rss {_gb(m.get('host_peak_rss_bytes'))}"
            f" step {step if step is None else round(step, 3)} s"
            f" tok/s {tps if tps is None else round(tps)}"
            f" wall {rec['wall_seconds']:.0f}/{est:.0f}s  {rec['case']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.measure", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="JSONL file the records are appended to "
                   "(default bench/results/<gpu>-x<count>-<date>.jsonl)")
    p.add_argument("--budget-seconds", type=float, default=None, help="wall-clock budget for the whole run")
    p.add_argument("--resume", action="store_true", help="skip cases that already have a record in --out")
    p.add_argument("--only", default=None, help="run only cases whose name matches this regex")
    p.add_argument("--max-gpus", type=int, default=None, help="skip cases needing more GPUs "
                   "(default: the GPUs NVML sees, 1 without a GPU)")
    p.add_argument("--list", action="store_true", help="print the selected cases and exit")
    p.add_argument("--matrix", choices=sorted(MATRICES), default="main",
                   help="main: the calibration matrix; heldout: configurations the constants never saw")
    p.add_argument("--cases-file", default=None, help="JSON list of cases to run instead of the matrix")
    p.add_argument("--steps", type=int, default=None, help="measured optimizer steps (default: per case)")
    p.add_argument("--warmup-steps", type=int, default=WARMUP_OPTIMIZER_STEPS,
                   help="warm-up optimizer steps before measuring")
    p.add_argument("--phase-steps", type=int, default=PHASE_STEPS,
                   help="optimizer steps after the measured ones, timed per phase (forward, backward, "
                   "optimizer step) with the GPU synchronised between phases; they do not enter "
                   "step_seconds")
    p.add_argument("--timeout-factor", type=float, default=3.0,
                   help="per-case limit = max(--min-case-timeout, factor x estimate)")
    p.add_argument("--min-case-timeout", type=float, default=90.0, help="floor of the per-case limit (s)")
    p.add_argument("--no-prebuild", action="store_true",
                   help="do not build DeepSpeed ops first (their build time then lands in a case)")
    p.add_argument("--no-probe", action="store_true",
                   help="do not measure the host's Python, dispatch and hook speed first (env.host_probe)")
    p.add_argument("--host-memory-bytes", type=int, default=None,
                   help="host RAM recorded in each spec's hardware (default 128 GiB per GPU)")
    p.add_argument("--work-dir", type=Path, default=None, help="where per-case logs go (default: a temp dir)")
    p.add_argument("--logs-archive", type=Path, default=None,
                   help="also pack every case's logs into this .tar.gz at the end")
    p.add_argument("--gpu-memory-limit", choices=("plan", "none"), default="none",
                   help="none (default): no limit, the natural peak the planner predicts; plan: limit "
                   "each rank's PyTorch allocator to the plan's per_gpu.allocator_limit_bytes")
    p.add_argument("--limit-slack-share", type=float, default=1.0,
                   help="with --gpu-memory-limit plan: keep only this share of the planned allocator "
                   "slack in the limit (below 1: an experiment, not an accuracy record)")
    p.add_argument("--alloc-trace", nargs="?", const="python", choices=("python", "none"), default=None,
                   help="record the caching allocator's history and write each rank's segment growth "
                   "and, per phase of each micro-step, the allocated peak and what was live there "
                   "(alloc-trace-rankN.json beside its log); the recording slows the steps and grows "
                   "host memory, so such records are diagnostics, not accuracy records. With torch "
                   "2.11 and DeepSpeed 0.19.8 a ZeRO-3 run fails in its first step when Python "
                   "stacks are recorded; 'none' records sizes only")
    args = p.parse_args(argv)
    if not 0.0 <= args.limit_slack_share <= 1.0:
        p.error("--limit-slack-share must lie in [0, 1]")
    if args.gpu_memory_limit == "none" and args.limit_slack_share != 1.0:
        p.error("--limit-slack-share needs --gpu-memory-limit plan")
    return args


def select(cases: list[Case], args: argparse.Namespace, max_gpus: int) -> list[Case]:
    rx = re.compile(args.only) if args.only else None
    chosen = [c for c in cases if (rx is None or rx.search(c.name)) and c.num_gpus <= max_gpus]
    if args.steps is not None:
        chosen = [Case(name=c.name, spec=c.spec, est_seconds=c.est_seconds, measured_steps=args.steps,
                       group=c.group, expect=c.expect) for c in chosen]
    return chosen


def main(argv: list[str] | None = None) -> int:
    start = time.monotonic()
    args = parse_args(argv)
    gpus = Gpus.discover()
    max_gpus = args.max_gpus if args.max_gpus is not None else max(1, len(gpus.handles))
    out = args.out or default_out(gpus)
    chosen = select(load_cases(args.cases_file, args.matrix), args, max_gpus)
    done = done_cases(out) if args.resume else set()
    if args.list:
        for c in chosen:
            mark = "done" if c.name in done else ""
            print(f"{c.group:5s} {c.est_seconds:6.0f}s gpus={c.num_gpus} {mark:4s} {c.name}")
        print(f"{len(chosen)} cases, {sum(c.est_seconds for c in chosen):.0f} s estimated")
        return 0
    todo = [c for c in chosen if c.name not in done]
    print(f"{len(todo)} cases to run ({len(chosen) - len(todo)} already recorded) -> {out}", flush=True)
    if not todo:
        return 0
    if args.alloc_trace:
        os.environ[ALLOC_TRACE_ENV] = args.alloc_trace  # inherited by every rank
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tunebox-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    budget = args.budget_seconds if args.budget_seconds is not None else float("inf")
    versions = {} if args.no_prebuild else prebuild(_needed_ops(todo), work, min(900.0, budget))
    env = env_info(gpus, versions)
    env["host_probe"] = None if args.no_probe else host_probe(work, min(120.0, budget))
    try:
        counts = _run_all(todo, args, env, gpus, work, out, start, budget)
    finally:
        if args.logs_archive:
            _archive(work, args.logs_archive)
    print(f"done in {time.monotonic() - start:.0f} s: " + ", ".join(f"{k} {v}" for k, v in counts.items())
          + f"; records in {out}; logs in {work}", flush=True)
    return 0


def _archive(work: Path, dest: Path) -> None:
    import tarfile

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(work, arcname="logs")


def _run_all(todo: list[Case], args: argparse.Namespace, env: dict[str, Any], gpus: Gpus, work: Path,
             out: Path, start: float, budget: float) -> dict[str, int]:
    counts: dict[str, int] = {}
    ratios: list[float] = []  # actual / estimated wall time, to correct later estimates
    for i, case in enumerate(todo, 1):
        remaining = budget - (time.monotonic() - start)
        scale = min(3.0, max(0.5, statistics.median(ratios))) if ratios else 1.0
        if case.est_seconds * scale > remaining:
            print(f"[{i:2d}/{len(todo)}] skip (est {case.est_seconds * scale:.0f} s > {remaining:.0f} s left)"
                  f"  {case.name}", flush=True)
            counts["skipped"] = counts.get("skipped", 0) + 1
            continue
        own_limit = max(args.min_case_timeout, args.timeout_factor * case.est_seconds)
        limit = min(own_limit, remaining)
        run = with_machine_hardware(case, gpus, args.host_memory_bytes)
        rec = run_case(run, env, gpus, work, limit, limit < own_limit, args.warmup_steps,
                       MemoryLimit(args.gpu_memory_limit, args.limit_slack_share), args.phase_steps)
        append_record(out, rec)
        if rec["status"] in ("ok", "oom"):
            ratios.append(rec["wall_seconds"] / case.est_seconds)
        counts[rec["status"]] = counts.get(rec["status"], 0) + 1
        expected = "" if case.expect == "ok" else f"  (expected {case.expect})"
        print(progress_line(i, len(todo), time.monotonic() - start, rec, case.est_seconds) + expected,
              flush=True)
        if rec["status"] != "ok" and rec["error"]:
            print("      " + rec["error"].strip().splitlines()[-1][:300], flush=True)
    return counts


# --------------------------------------------------------------------------- children


def prebuild_main(op: str, result: Path) -> int:
    t0 = time.perf_counter()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(op)
    if builder is None or not builder.is_compatible(verbose=False):
        state = "not used here"
    else:
        builder.load(verbose=False)
        state = "ready"
    result.write_text(json.dumps({"op": op, "state": state, "seconds": time.perf_counter() - t0,
                                  "versions": _versions()}))
    return 0


def build_model_main(config_file: Path, dest: Path) -> int:
    """A random-init model of the config in ``config_file`` with the bench's tokenizer, saved in
    bf16 to ``dest`` (built on the GPU where there is one)."""
    import torch

    from bench.service_gpu import save_random_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    save_random_model(json.loads(config_file.read_text()), dest, device)
    return 0


def _versions() -> dict[str, Any]:
    import deepspeed
    import peft
    import torch
    import transformers
    from deepspeed.accelerator import get_accelerator

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "deepspeed": deepspeed.__version__,
            "transformers": transformers.__version__, "peft": peft.__version__,
            "accelerator": get_accelerator().device_name()}


def _train(job: dict[str, Any], result: dict[str, Any]) -> None:
    """The service's trainer on the case's run.json, measured around its own steps."""
    import torch

    from bench.measured_trainer import MeasuredTrainer
    from tunebox.hostclock import probe
    from worker._trainlib.runfile import load_run
    from worker.train import _prepare_environment

    run = load_run(Path(job["job_dir"]))
    cuda = run.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # the host's speed as this case found it, before DeepSpeed patches anything: the run's own
    # probe (env.host_probe) is one reading for every case of the run
    result["host_probe"] = probe("cuda" if cuda else "cpu")
    result["versions"] = _versions()
    _prepare_environment(run)
    marks: list[str] | None = None
    if cuda and os.environ.get(ALLOC_TRACE_ENV):
        # "none": sizes and addresses only (the recording of Python stacks breaks ZeRO-3's linear)
        with_stacks = os.environ[ALLOC_TRACE_ENV] != "none"
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python",
                                                 context="alloc" if with_stacks else None)
        result["alloc_trace"] = True
        marks = result.setdefault("trace_marks", [])

    def mark(label: str) -> None:
        if marks is not None:
            _trace_mark(torch, label, marks)

    trainer = MeasuredTrainer(run, result, mark)
    try:
        trainer.measure(int(job["warmup_steps"]), int(job["measured_steps"]), int(job.get("phase_steps", 0)))
    finally:
        trainer.progress.close()


def _is_oom(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name == "OutOfMemoryError" or any(m in str(exc) for m in OOM_MARKERS)


def child_main(case_file: Path, rank: int, result_path: Path) -> int:
    job = json.loads(case_file.read_text())
    result: dict[str, Any] = {"rank": rank, "status": "error", "error": None, "host_phases": {},
                              "phase_peaks": {"after_init_allocated": None,
                                              "forward_backward_allocated_peak": None,
                                              "optimizer_step_allocated_peak": None},
                              "step_allocated_peaks": {"warmup_micro_steps": [], "measured_steps": []}}
    try:
        _train(job, result)
        result["status"] = "ok"
    except BaseException as exc:  # every failure becomes a result the parent can classify
        result["status"] = "oom" if _is_oom(exc) else "error"
        result["error"] = "".join(traceback.format_exception(exc))[-4000:]
        traceback.print_exc()
    finally:
        _finish(result, result_path)
    # Skip interpreter teardown: NCCL and DeepSpeed destructors can hang after a failure.
    os._exit(0 if result["status"] == "ok" else 3)


def _trace_mark(torch: Any, label: str, marks: list[str]) -> None:
    """Put a recognisable allocation into the allocator's history (found by this function's name in
    its frames) so the summary can split the history into the phases of a step."""
    marks.append(label)
    torch.empty(TRACE_MARK_BYTES, dtype=torch.uint8, device="cuda")  # freed at once


#: An odd size (a multiple of the allocator's 512-byte rounding) that a history without stacks can
#: still tell apart from the model's own blocks.
TRACE_MARK_BYTES = 1021 * 512
_NO_PYTHON = "(no Python frame: the autograd engine)"


def _live_key(ev: dict[str, Any]) -> str:
    """Blocks are grouped by the first frames of their allocation; blocks without a Python frame
    (the autograd engine's, or every block in a history without stacks) by their size."""
    return " < ".join(_where(ev, 3)) or f"{_NO_PYTHON}, {int(ev.get('size', 0))} B each"


def _where(ev: dict[str, Any], frames: int) -> list[str]:
    return [f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in ev.get("frames", [])
            if "torch/" not in f["filename"] or "torch/nn/modules" in f["filename"]][:frames]


def _is_mark(ev: dict[str, Any]) -> bool:
    if ev.get("action") != "alloc":
        return False
    frames = ev.get("frames") or []
    if frames:
        return any(f.get("name") == "_trace_mark" for f in frames)
    return int(ev.get("size", 0)) == TRACE_MARK_BYTES


def _live_groups(live: dict[int, tuple[int, str]], top: int) -> list[dict[str, Any]]:
    groups: dict[str, list[int]] = {}
    for size, key in live.values():
        groups.setdefault(key, []).append(size)
    rows = [{"where": key, "bytes": sum(sizes), "count": len(sizes),
             "largest": sorted(sizes, reverse=True)[:4]} for key, sizes in groups.items()]
    return sorted(rows, key=lambda r: -r["bytes"])[:top]


def alloc_trace_summary(snapshot: dict[str, Any], device: int, frames: int = 8,
                        marks: list[str] | None = None, top: int = 25) -> dict[str, Any]:
    """The caching allocator's history on one device, reduced to what explains the peaks: every
    segment it reserved (size, the allocated total just before, the request that caused it and where
    it came from), the moment reserved peaked, each segment's free blocks at the end, and, for the
    whole history and for each phase between two marks (``_trace_mark``), the allocated peak with
    the blocks live at that moment grouped by where they were allocated."""
    events = snapshot.get("device_traces", [[]])[device]
    allocated = reserved = 0
    peak_alloc = peak_res = 0
    at_peak_res: dict[str, int] = {}
    grows: list[dict[str, Any]] = []
    labels = list(marks or [])
    phase = ["before the first mark"]
    phase_peaks: dict[int, tuple[int, int]] = {}  # phase index -> (allocated peak, event)
    peak_event = -1
    for i, ev in enumerate(events):
        action, size = ev.get("action"), int(ev.get("size", 0))
        if _is_mark(ev):
            phase.append(labels[len(phase) - 1] if len(phase) - 1 < len(labels) else f"mark {len(phase)}")
        if action == "alloc":
            allocated += size
            if allocated > peak_alloc:
                peak_alloc, peak_event = allocated, i
            p = len(phase) - 1
            if allocated > phase_peaks.get(p, (-1, 0))[0]:
                phase_peaks[p] = (allocated, i)
        elif action == "free_completed":
            allocated -= size
        elif action == "segment_alloc":
            reserved += size
            grows.append({"event": i, "segment_bytes": size, "allocated_before": allocated,
                          "reserved_after": reserved, "where": _where(ev, frames)})
        elif action == "segment_free":
            reserved -= size
        if reserved > peak_res:
            peak_res = reserved
            at_peak_res = {"event": i, "reserved": reserved, "allocated": allocated}
    # Replay once more, keeping every live block, to list what was live at each peak.
    wanted = {ev_i for _, ev_i in phase_peaks.values()} | {peak_event}
    live: dict[int, tuple[int, str]] = {}
    at: dict[int, list[dict[str, Any]]] = {}
    for i, ev in enumerate(events):
        action = ev.get("action")
        if action == "alloc":
            live[int(ev.get("addr", i))] = (int(ev.get("size", 0)), _live_key(ev))
        elif action == "free_completed":
            live.pop(int(ev.get("addr", -1)), None)
        if i in wanted:
            at[i] = _live_groups(live, top)
    phases_out = [{"phase": phase[p], "peak_allocated": a, "event": ev_i, "live": at.get(ev_i, [])}
                  for p, (a, ev_i) in sorted(phase_peaks.items())]
    segments = []
    for seg in snapshot.get("segments", []):
        if seg.get("device") != device:
            continue
        free = sorted((int(b["size"]) for b in seg.get("blocks", []) if b.get("state") == "inactive"),
                      reverse=True)
        segments.append({"total_bytes": int(seg["total_size"]), "allocated_bytes": int(seg["allocated_size"]),
                         "free_blocks": free[:8], "free_bytes": sum(free)})
    return {"events": len(events), "peak_allocated": peak_alloc, "peak_reserved": peak_res,
            "at_peak_reserved": at_peak_res, "at_peak_allocated": {"event": peak_event,
                                                                   "live": at.get(peak_event, [])},
            "phases": phases_out, "segment_allocs": grows,
            "segments_at_end": sorted(segments, key=lambda s: -s["total_bytes"])}


def _write_alloc_trace(result_path: Path, marks: list[str] | None) -> None:
    import torch

    dev = torch.cuda.current_device()
    summary = alloc_trace_summary(torch.cuda.memory._snapshot(), dev, marks=marks)
    (result_path.parent / f"alloc-trace-{result_path.stem}.json").write_text(json.dumps(summary))


def _finish(result: dict[str, Any], result_path: Path) -> None:
    import resource

    if result.get("alloc_trace"):
        with contextlib.suppress(Exception):
            _write_alloc_trace(result_path, result.pop("trace_marks", None))
    peaks = result.pop("peaks", None)
    if peaks is not None:
        with contextlib.suppress(Exception):
            peaks.fold()
        result["torch_max_allocated_bytes"] = peaks.allocated if peaks.cuda else None
        result["torch_max_reserved_bytes"] = peaks.reserved if peaks.cuda else None
        if peaks.cuda:
            with contextlib.suppress(Exception):
                # how often the allocator hit its limit (or the card's) and freed its cache to retry
                result["allocator_retries"] = int(peaks.torch.cuda.memory_stats().get("num_alloc_retries", 0))
    result["ru_maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(result_path)
    sys.stdout.flush()
    sys.stderr.flush()


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        p = argparse.ArgumentParser()
        p.add_argument("--child", type=Path, required=True)
        p.add_argument("--rank", type=int, required=True)
        p.add_argument("--result", type=Path, required=True)
        a = p.parse_args(argv)
        return child_main(a.child, a.rank, a.result)
    if argv[:1] == ["--probe"]:
        p = argparse.ArgumentParser()
        p.add_argument("--probe", action="store_true")
        p.add_argument("--result", type=Path, required=True)
        return probe_main(p.parse_args(argv).result)
    if argv[:1] == ["--build-model"]:
        p = argparse.ArgumentParser()
        p.add_argument("--build-model", type=Path, required=True)
        p.add_argument("--dest", type=Path, required=True)
        a = p.parse_args(argv)
        return build_model_main(a.build_model, a.dest)
    if argv[:1] == ["--prebuild"]:
        p = argparse.ArgumentParser()
        p.add_argument("--prebuild", required=True)
        p.add_argument("--result", type=Path, required=True)
        a = p.parse_args(argv)
        return prebuild_main(a.prebuild, a.result)
    return main(argv)


if __name__ == "__main__":
    sys.exit(_dispatch(sys.argv[1:]))
