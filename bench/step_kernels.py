"""Where a training micro-step's GPU time goes: matmuls, attention, and the memory-bound rest.

The planner times a micro-step's GPU work as its matmul FLOPs at a fraction of the card's tensor
rate. The other kernels (norms, rotary embeddings, activations, residual adds, dropout, LoRA's
scaling and sums, the loss over the vocabulary, eager attention's passes over its scores) do
little arithmetic on many bytes: they run at the card's memory bandwidth, not its tensor rate. This
measures them as the trainer runs them: the model built from its config the way the trainer loads it
(bf16, the job's attention, ``worker._trainlib.modeling``'s checkpointing and LoRA), one forward and
backward of the model's own loss on causal rows, under the profiler. Each CUDA kernel's device time
goes to ``gemm`` (cuBLAS/CUTLASS matmuls), ``attention`` (the fused SDPA kernels) or ``other``.

Each configuration runs with 1 and 3 decoder layers, so a layer's share and the rest (embedding,
final norm, LM head and loss) separate (``per_layer``). ``fit`` reads a report's ``other`` time as
the planner counts it: the elements the memory-bound kernels pass over
(``planner.speed.memory_bound_elements``), each kind at its own cost in bytes, at the card's
bandwidth; it prints the planner's ``MEMORY_BYTES_*`` constants.

    python3 -m bench.step_kernels --out step-kernels.json [--model qwen2.5-0.5b ...]
    python3 -m bench.step_kernels --fit REPORT --bandwidth-gbps 3350
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cases import MODELS  # noqa: E402

DEFAULT_MODELS = ["qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3.2-1b", "llama-3.2-3b", "gemma-2-2b",
                  "qwen2.5-7b", "mistral-7b-v0.3"]
#: (micro-batch, sequence length) of each timed micro-step
SHAPES = [(1, 2048), (2, 2048), (1, 4096)]
LAYERS = (1, 3)

_GEMM = ("gemm", "nvjet", "cutlass", "xmma", "gemv", "splitkreduce", "cublas")
_ATTENTION = ("flash", "fmha", "attention", "efficient_attention", "sdpa", "cudnn")


def kernel_kind(name: str) -> str:
    """``gemm``, ``attention`` or ``other`` for a CUDA kernel's name."""
    low = name.lower()
    if any(k in low for k in _ATTENTION) and "softmax" not in low:
        return "attention"
    if any(k in low for k in _GEMM):
        return "gemm"
    return "other"


def classify(kernels: list[tuple[str, float]]) -> dict[str, Any]:
    """Seconds per kind from (kernel name, seconds) pairs, and the ten costliest ``other`` kernels."""
    out: dict[str, Any] = {"gemm_s": 0.0, "attention_s": 0.0, "other_s": 0.0}
    others: dict[str, float] = {}
    for name, seconds in kernels:
        kind = kernel_kind(name)
        out[f"{kind}_s"] += seconds
        if kind == "other":
            others[name] = others.get(name, 0.0) + seconds
    out["top_other"] = [[n[:120], s] for n, s in sorted(others.items(), key=lambda x: -x[1])[:10]]
    return out


def attention_for(model: str, attn: str) -> str:
    """The attention the service trains ``model`` with when the job asks for ``attn`` (``auto``:
    asks for none), as the planner resolves it."""
    from planner.arch import arch_from_config
    from planner.core import attention_for as resolved

    return resolved(arch_from_config(MODELS[model]), None if attn == "auto" else attn)


def _config(model: str, layers: int) -> dict[str, Any]:
    cfg = dict(MODELS[model])
    cfg["num_hidden_layers"] = layers
    if "layer_types" in cfg:
        cfg["layer_types"] = list(cfg["layer_types"])[:layers]
    return cfg


def build(model: str, layers: int, method: str, attn: str, checkpointing: bool,
          device: str | None = "cuda") -> Any:
    """The model as the trainer has it: from its config in bf16 on ``device`` (None: where the
    context puts it, partitioned under ZeRO-3's ``zero.Init``), its attention, then checkpointing
    and LoRA (the service's default adapter) in the trainer's order."""
    import contextlib

    import torch
    from transformers import AutoModelForCausalLM

    from bench.cases import hf_config
    from planner.spec import LoraSpec
    from worker._trainlib import modeling

    config = hf_config(_config(model, layers))
    with torch.device(device) if device else contextlib.nullcontext():
        m = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation=attn)
    m.config.use_cache = False
    if method == "lora":
        m.requires_grad_(False)
    if checkpointing:
        modeling.enable_checkpointing(m, method == "lora")
    if method == "lora":
        m = modeling.apply_lora(m, LoraSpec())
    m.train()
    return m


def _device_kernels(prof: Any) -> list[tuple[str, float]]:
    out = []
    for evt in prof.events():
        if str(getattr(evt, "device_type", "")).endswith("CUDA") and evt.name:
            us = getattr(evt, "device_time", None)
            if us is None:
                us = getattr(evt, "cuda_time", 0.0)
            out.append((evt.name, float(us) / 1e6))
    return out


def measure(m: Any, vocab: int, batch: int, seq: int, repeats: int) -> dict[str, Any]:
    """One micro-step (forward and backward of the model's loss) under the profiler, per step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step() -> None:
        m(input_ids=ids, labels=ids, use_cache=False).loss.backward()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            step()
        torch.cuda.synchronize()
    kinds = classify(_device_kernels(prof))
    for k in ("gemm_s", "attention_s", "other_s"):
        kinds[k] /= repeats
    kinds["top_other"] = [[n, s / repeats] for n, s in kinds["top_other"]]
    m.zero_grad(set_to_none=True)
    return {"wall_s": statistics.median(walls), **kinds}


def run(models: list[str], methods: list[str], attns: list[str], repeats: int,
        done: Any = None) -> list[dict[str, Any]]:
    """Every configuration's rows; ``done(rows)`` after each model's, so a run cut short keeps them."""
    import gc

    import torch

    rows: list[dict[str, Any]] = []
    for model in models:
        for method in methods:
            for attn in sorted({attention_for(model, a) for a in attns}):
                for checkpointing in (True, False):
                    for layers in LAYERS:
                        m = build(model, layers, method, attn, checkpointing)
                        for batch, seq in SHAPES:
                            row = {"model": model, "method": method, "attn": attn,
                                   "checkpointing": checkpointing, "layers": layers, "batch": batch,
                                   "seq": seq, **measure(m, MODELS[model]["vocab_size"], batch, seq, repeats)}
                            rows.append(row)
                            print(model, method, attn, checkpointing, layers, batch, seq,
                                  f"gemm {row['gemm_s'] * 1e3:.2f} attn {row['attention_s'] * 1e3:.2f} "
                                  f"other {row['other_s'] * 1e3:.2f} wall {row['wall_s'] * 1e3:.2f} ms",
                                  flush=True)
                        del m
                        gc.collect()
                        torch.cuda.empty_cache()
        if done is not None:
            done(rows)
    return rows


def per_layer(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Each configuration's ``key`` seconds split into one decoder layer's and the rest's (embedding,
    final norm, head and loss), from its 1- and 3-layer rows."""
    by = {}
    for r in rows:
        by[(r["model"], r["method"], r["attn"], r["checkpointing"], r["batch"], r["seq"], r["layers"])] = r
    out = []
    for (model, method, attn, ckpt, batch, seq, layers), r in sorted(by.items()):
        if layers != LAYERS[0]:
            continue
        deep = by.get((model, method, attn, ckpt, batch, seq, LAYERS[1]))
        if deep is None:
            continue
        layer = (deep[key] - r[key]) / (LAYERS[1] - LAYERS[0])
        out.append({"model": model, "method": method, "attn": attn, "checkpointing": ckpt, "batch": batch,
                    "seq": seq, "layer_s": layer, "rest_s": r[key] - LAYERS[0] * layer})
    return out


def row_spec(row: dict[str, Any]) -> dict[str, Any]:
    """A bench row as a job spec: its model at the row's depth, the service's default adapter."""
    return {"model": {"config": _config(row["model"], row["layers"])}, "method": row["method"],
            "training": {"micro_batch_size": row["batch"], "gradient_accumulation_steps": 1,
                         "seq_len": row["seq"], "gradient_checkpointing": row["checkpointing"],
                         "attn_implementation": row["attn"]},
            "resources": {"num_gpus": 1, "zero_stage": 0, "offload_optimizer": "none",
                          "offload_param": "none"},
            "hardware": {"gpu_count": 1, "gpu_memory_bytes": 80 * 2**30, "host_memory_bytes": 128 * 2**30}}


def elements(row: dict[str, Any]) -> tuple[dict[str, float], float]:
    """What the row's memory-bound kernels pass over, and its adapters' bytes, as the planner
    counts them."""
    from bench.accuracy import record_setup
    from planner.speed import adapter_bytes, memory_bound_elements

    p, s = record_setup(row_spec(row))
    return memory_bound_elements(p.facts, s), adapter_bytes(p.facts, s)


def fit(rows: list[dict[str, Any]], bandwidth_gbps: float) -> dict[str, float]:
    """Bytes per element of each kind, least squares on the relative error of every row's ``other``
    seconds at ``bandwidth_gbps``; kinds no row exercises are left out."""
    import numpy as np

    counted = [elements(r) for r in rows]
    kinds = [k for k in counted[0][0] if any(c[k] for c, _ in counted)]
    rate = bandwidth_gbps * 1e9
    design = np.array([[c[k] for k in kinds] for c, _ in counted]) / rate
    seconds = np.array([r["other_s"] - adapters / rate
                        for r, (_, adapters) in zip(rows, counted, strict=True)])
    coef = np.linalg.lstsq(design / seconds[:, None], np.ones(len(rows)), rcond=None)[0]
    return {k: float(v) for k, v in zip(kinds, coef, strict=True)}


def matmul_efficiency(rows: list[dict[str, Any]], matmul_tflops: float) -> float:
    """The median over the rows of the matmul FLOPs the planner counts (attention's causal FLOPs
    left out where SDPA's fused kernel runs them) over the matmul kernels' time, as a fraction of
    the card's bf16 matmul rate: the planner's ``MFU`` as these kernels ran."""
    from bench.accuracy import record_setup
    from planner.speed import GpuRates, causal_attention_micro_flops, step_terms

    out = []
    for r in rows:
        p, s = record_setup(row_spec(r))
        flops = step_terms(p.facts, s, GpuRates()).flops_per_micro
        if s.attn_implementation != "eager":
            flops -= causal_attention_micro_flops(p.facts, s)
        out.append(flops / r["gemm_s"] / (matmul_tflops * 1e12))
    return statistics.median(out)


def predicted(row: dict[str, Any], per_element: dict[str, float], bandwidth_gbps: float) -> float:
    counted, adapters = elements(row)
    fitted = sum(per_element.get(k, 0.0) * n for k, n in counted.items())
    return (fitted + adapters) / (bandwidth_gbps * 1e9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fit", type=Path, metavar="REPORT", help="print the planner's constants from a report")
    ap.add_argument("--bandwidth-gbps", type=float, help="the card's datasheet memory bandwidth (with --fit)")
    ap.add_argument("--matmul-tflops", type=float, help="the card's bf16 matmul rate (with --fit)")
    ap.add_argument("--model", nargs="+", default=DEFAULT_MODELS, choices=sorted(MODELS))
    ap.add_argument("--method", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    ap.add_argument("--attn", nargs="+", default=["auto"], choices=["auto", "sdpa", "eager"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.fit:
        if not args.bandwidth_gbps:
            ap.error("--fit needs --bandwidth-gbps")
        rows = json.loads(args.fit.read_text())["rows"]
        per_element = fit(rows, args.bandwidth_gbps)
        print(json.dumps({k: round(v, 2) for k, v in per_element.items()}, indent=1))
        errors = sorted(predicted(r, per_element, args.bandwidth_gbps) / r["other_s"] - 1 for r in rows)
        print(f"{len(rows)} rows: median |error| {statistics.median(abs(e) for e in errors):.1%}, "
              f"from {errors[0]:+.1%} to {errors[-1]:+.1%}")
        if args.matmul_tflops:
            print(f"MFU {matmul_efficiency(rows, args.matmul_tflops):.3f}")
        return 0
    if not args.out:
        ap.error("--out is needed")
    import torch
    import transformers

    started = time.time()

    def write(rows: list[dict[str, Any]]) -> None:
        report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "transformers": transformers.__version__, "seconds": round(time.time() - started, 1),
                  "rows": rows}
        args.out.write_text(json.dumps(report, indent=1))

    run(args.model, args.method, args.attn, args.repeats, done=write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
