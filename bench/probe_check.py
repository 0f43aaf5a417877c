"""The box probe's figures against plain PyTorch measurements of the same things, on a GPU box.

Runs the probe child exactly as the worker does (``python -m tunebox.probe``), then, each in its own
process:

- the bf16 matmul rate of a plain ``torch.matmul`` loop timed with CUDA events, at the probe's shape
  and at the shapes of a 0.5B, 7B and 70B model's projections;
- pinned host-to-device and device-to-host copies of 1 GiB (as ``bench/pcie.py``);
- the memory a process holds outside PyTorch's allocator, NVML's per-process figure less
  ``torch.cuda.memory_reserved()``, after the first cuBLAS matmul and again after NCCL's first
  all-reduce;
- DeepSpeed's CPU Adam on 2^24 and 2^26 parameters.

It prints and writes one JSON object (versions, the probe's figures, the plain figures, and each
probe figure over its plain one), which docs/hardware.md records. Run from the repository root:

    python3 -m bench.probe_check --out $OUT/probe-check.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: (tokens, in, out) of a projection: the probe's shape and three models' MLP up-projections
MATMUL_SHAPES = {
    "probe": (8192, 4096, 11008),
    "qwen2.5-0.5b-mlp": (8192, 896, 4864),
    "qwen2.5-7b-mlp": (8192, 3584, 18944),
    "llama-70b-mlp": (4096, 8192, 28672),
}


def _child(code: str, timeout: float = 600) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


MATMUL = """
import json, torch
shapes = {shapes!r}
out = {{}}
for name, (m, k, n) in shapes.items():
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        for _ in range(50):
            torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000 / 50)
    out[name] = round(2.0 * m * k * n / best / 1e12, 2)
print(json.dumps(out))
"""

COPIES = """
import json, time, torch
n = 1 << 30
host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
gpu = torch.empty(n, dtype=torch.uint8, device="cuda")
out = {}
for name, (dst, src) in {"h2d_pinned_gbps": (gpu, host), "d2h_pinned_gbps": (host, gpu)}.items():
    dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter(); dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    out[name] = round(n / min(times) / 1e9, 2)
print(json.dumps(out))
"""

OUTSIDE = """
import json, os, tempfile, torch, pynvml
import torch.distributed as dist
def nvml():
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    used = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h) if p.pid == os.getpid()]
    return used[0] if used else None
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()
torch.cuda.synchronize()
out = {"context_bytes": nvml() - torch.cuda.memory_reserved(), "torch_cuda": torch.version.cuda,
       "driver": pynvml.nvmlSystemGetDriverVersion()}
with tempfile.TemporaryDirectory() as tmp:
    dist.init_process_group("nccl", store=dist.FileStore(os.path.join(tmp, "s"), 1), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    x = torch.ones(1024, device="cuda"); dist.all_reduce(x); torch.cuda.synchronize()
    out["with_nccl_bytes"] = nvml() - torch.cuda.memory_reserved()
    dist.destroy_process_group()
print(json.dumps(out))
"""

ADAM = """
import json, time, torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
out = {}
for n in (1 << 24, 1 << 26):
    p = torch.nn.Parameter(torch.zeros(n)); p.grad = torch.randn(n)
    opt = DeepSpeedCPUAdam([p], lr=1e-4); opt.step()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter(); opt.step(); best = min(best, time.perf_counter() - t0)
    out[str(n)] = round(n / best)
print(json.dumps(out))
"""


def _versions() -> dict[str, Any]:
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": version("torch"),
        "deepspeed": version("deepspeed"),
        "cpu_count": os.cpu_count(),
    }


def _ratio(a: Any, b: Any) -> float | None:
    return round(a / b, 4) if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        probe = subprocess.run(
            [sys.executable, "-m", "tunebox.probe", "--nvme-dir", tmp, "--cpu-adam"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=900,
            check=False,
        )
    probed: dict[str, Any] = (
        json.loads(probe.stdout.strip().splitlines()[-1])
        if probe.returncode == 0
        else {"error": probe.stderr[-2000:]}
    )
    probe_seconds = round(time.monotonic() - started, 1)
    plain = {
        "matmul_tflops": _child(MATMUL.format(shapes=MATMUL_SHAPES)),
        "copies": _child(COPIES),
        "outside_allocator": _child(OUTSIDE),
        "cpu_adam_elements_per_s": _child(ADAM, timeout=900),
    }
    f = probed.get("figures", {})
    report = {
        "versions": _versions(),
        "probe_seconds": probe_seconds,
        "probe": probed,
        "plain": plain,
        "probe_over_plain": {
            "matmul_tflops": _ratio(f.get("matmul_tflops"), plain["matmul_tflops"].get("probe")),
            "h2d_pinned_gbps": _ratio(f.get("h2d_pinned_gbps"), plain["copies"].get("h2d_pinned_gbps")),
            "d2h_pinned_gbps": _ratio(f.get("d2h_pinned_gbps"), plain["copies"].get("d2h_pinned_gbps")),
            "cuda_context_bytes": _ratio(
                f.get("cuda_context_bytes"), plain["outside_allocator"].get("context_bytes")
            ),
            "cpu_adam_elements_per_s": _ratio(
                f.get("cpu_adam_elements_per_s"), plain["cpu_adam_elements_per_s"].get(str(1 << 24))
            ),
        },
    }
    text = json.dumps(report, indent=1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
