"""Auto's choice against an exhaustive enumeration of the candidate grid, and against the field
report's blanket configuration (ZeRO-3, optimizer and parameters offloaded to the CPU,
micro-batch 1, checkpointing), for 12 (model, method, budget) cases on one GPU.

Run from the repository root: ``.venv/bin/python bench/search_table.py``; it prints the Markdown
table docs/planner.md carries. Planned figures only: the step-time model's tokens/s.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``planner`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import PlanError, plan  # noqa: E402
from planner.core import _base_setup, _choices, prepare  # noqa: E402
from planner.search import evaluate, points  # noqa: E402

GIB = 1024**3
CASES = [
    ("Qwen/Qwen2.5-0.5B", "full", 16),
    ("Qwen/Qwen2.5-1.5B", "full", 32),
    ("Qwen/Qwen2.5-1.5B", "full", 40),
    ("Qwen/Qwen2.5-3B", "full", 48),
    ("Qwen/Qwen2.5-3B", "full", 64),
    ("Qwen/Qwen2.5-7B", "lora", 24),
    ("Qwen/Qwen2.5-7B", "qlora", 12),
    ("Qwen/Qwen2.5-7B", "qlora", 16),
    ("meta-llama/Llama-3.1-8B", "lora", 80),
    ("meta-llama/Llama-3.2-1B", "full", 24),
    ("google/gemma-2-9b", "qlora", 24),
    ("Qwen/Qwen2.5-14B", "lora", 141),
]


def spec(model: str, method: str, gib: int, **resources: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": {"name": model},
        "method": method,
        "training": {"seq_len": 1024, "gradient_accumulation_steps": 16},
        "resources": resources,
        "hardware": {"gpu_count": 1, "gpu_memory_bytes": gib * GIB, "host_memory_bytes": 256 * GIB},
    }
    if "micro_batch_size" in resources:
        out["training"].update(micro_batch_size=resources.pop("micro_batch_size"),
                               gradient_checkpointing=resources.pop("gradient_checkpointing"))
    return out


def best_enumerated(s: dict[str, Any]) -> tuple[float, int]:
    p = prepare(s)
    base = _base_setup(p)
    choices, _ = _choices(p, base)
    every = [evaluate(p.facts, setup, p.bounds, p.rates) for setup, _ in points(base, choices)]
    fitting = [c.speed.tokens_per_second for c in every if c.fits]
    return (max(fitting) if fitting else 0.0), len(every)


def describe(p: Any) -> str:
    r = p.resolved
    offload = "/".join(x for x in (r.offload_optimizer, r.offload_param) if x != "none") or "no offload"
    ckpt = ", ckpt" if r.gradient_checkpointing else ""
    return f"ZeRO-{r.zero_stage}, {offload}, mb {r.micro_batch_size}x{r.gradient_accumulation_steps}{ckpt}"


def main() -> None:
    print("| model | method | GPU | auto's choice | auto tok/s | best of grid (points) | blanket tok/s "
          "| auto / blanket |")
    print("|---|---|---|---|---|---|---|---|")
    for model, method, gib in CASES:
        auto = plan(spec(model, method, gib))
        best, n = best_enumerated(spec(model, method, gib))
        try:
            blanket = plan(spec(model, method, gib, num_gpus=1, zero_stage=3, offload_optimizer="cpu",
                                offload_param="cpu", micro_batch_size=1, gradient_checkpointing=True))
            b = blanket.estimated_tokens_per_second if blanket.fits else 0.0
            ratio = f"{(auto.estimated_tokens_per_second if auto.fits else 0.0) / b:.1f}x" if b else (
                "blanket does not fit")
        except PlanError:  # QLoRA does not run under ZeRO-3
            b, ratio = 0.0, "blanket not runnable"
        a = auto.estimated_tokens_per_second if auto.fits else 0.0
        choice = describe(auto) if auto.fits else "does not fit"
        print(f"| {model.split('/')[-1]} | {method} | {gib} GiB | {choice} | {a:,.0f} | {best:,.0f} ({n}) | "
              f"{b:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
