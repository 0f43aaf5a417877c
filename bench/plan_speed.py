"""How fast ``planner.plan`` is: median wall time of an explicit plan and of a full "auto" search.

Run from the repository root: ``.venv/bin/python bench/plan_speed.py [--repeat N]``. Targets: an
explicit config <= 2 ms, a full auto-search <= 50 ms (median, one CPU core). A refusal (nothing
of the job fits, so the search goes on to other methods and shorter sequences) is reported too.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``planner`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import plan  # noqa: E402

GIB = 1024**3
H200 = {
    "gpu_count": 8,
    "gpu_memory_bytes": 143_771_156_480,
    "host_memory_bytes": 1024 * GIB,
    "nvme_bytes": 4000 * GIB,
}


def explicit(model: str) -> dict[str, Any]:
    return {
        "model": {"name": model},
        "method": "lora",
        "training": {
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 4,
            "seq_len": 2048,
            "gradient_checkpointing": True,
        },
        "resources": {"num_gpus": 2, "zero_stage": 3, "offload_optimizer": "none", "offload_param": "none"},
        "hardware": H200,
    }


def auto(model: str) -> dict[str, Any]:
    return {
        "model": {"name": model},
        "method": "full",
        "training": {
            "micro_batch_size": "auto",
            "gradient_accumulation_steps": 16,
            "seq_len": 2048,
            "gradient_checkpointing": "auto",
            "loss_chunk_tokens": "auto",
        },
        "resources": {
            "num_gpus": "auto",
            "zero_stage": "auto",
            "offload_optimizer": "auto",
            "offload_param": "auto",
        },
        "hardware": H200,
    }


def refusal() -> dict[str, Any]:
    """7B LoRA on one 10 GiB card: no configuration of the job fits; the fixes change the job."""
    return {
        "model": {"name": "Qwen/Qwen2.5-7B"},
        "method": "lora",
        "training": {"seq_len": 1024, "gradient_accumulation_steps": 8},
        "hardware": {"gpu_count": 1, "gpu_memory_bytes": 10 * GIB, "host_memory_bytes": 64 * GIB},
    }


def median_ms(spec: dict[str, Any], repeat: int) -> float:
    plan(spec)  # warm: the catalogue is read on first use
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        plan(spec)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    print(
        f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.processor() or platform.platform()}"
    )
    print(f"{'case':<44} {'median ms':>10}  target")
    rows = []
    for model in ("Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-70B"):
        rows.append((f"explicit LoRA ZeRO-3 x2, {model}", median_ms(explicit(model), args.repeat), 2.0))
        rows.append(
            (f"auto search (8 GPUs, NVMe), {model}", median_ms(auto(model), max(5, args.repeat // 5)), 50.0)
        )
    rows.append(("refusal, 7B LoRA on 1 x 10 GiB", median_ms(refusal(), max(5, args.repeat // 5)), 200.0))
    for name, ms, target in rows:
        print(f"{name:<44} {ms:>10.2f}  <= {target:g} {'ok' if ms <= target else 'SLOW'}")


if __name__ == "__main__":
    main()
