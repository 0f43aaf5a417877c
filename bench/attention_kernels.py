"""What attention costs when the trainer's rows carry a mask, against the causal kernel without one.

The trainer packs examples into rows and restarts positions at each example, so transformers hands
SDPA an explicit mask; SDPA then cannot run its flash kernel (which skips the masked half of a causal
square), and transformers expands grouped k/v to every head before the call. Without a mask (every
row one sequence of ``seq_len``) it runs the causal flash kernel on grouped k/v. For each named
model's attention shape (heads, k/v heads, head dim) and each sequence length, this times on the
GPU both calls as the trainer makes them, forward and forward + backward: ``causal`` (``is_causal``,
``enable_gqa``) and ``masked`` (k/v repeated to every head, a boolean mask of ``--examples``
causal blocks down the diagonal). Each figure is the median of ``--repeats`` CUDA-synchronised
timings. ``masked_over_causal`` is what the planner's step time needs: how much longer attention
takes with the mask than the causal FLOPs at the causal kernel's rate.

    python3 -m bench.attention_kernels --out attention-kernels.json [--model llama-3.1-8b ...]
        [--seq 2048 4096 8192] [--batch 1 2]
    python3 -m bench.attention_kernels --fit REPORT --matmul-tflops 783.13

``--fit`` reads a report's masked calls as the planner counts them (``fit``): each layer's call,
forward and backward, takes a fixed time plus its causal FLOPs (three times the forward's) at a rate
that depends on the head dimension; the forward alone is a share of that. It prints the planner's
``MASKED_ATTENTION_*`` constants, the rates as fractions of the card's bf16 matmul rate.
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
from planner.arch import arch_from_config  # noqa: E402
from planner.speed import head_dim_band  # noqa: E402

DEFAULT_MODELS = ["qwen2.5-1.5b", "llama-3.2-3b", "gemma-2-2b", "qwen2.5-7b", "llama-3.1-8b"]


def attention_shapes(models: list[str]) -> dict[str, tuple[int, int, int]]:
    """(heads, k/v heads, head dim) of each model's attention."""
    out = {}
    for m in models:
        a = arch_from_config(MODELS[m])
        out[m] = (a.num_heads, a.num_kv_heads, a.head_dim)
    return out


def packed_mask(batch: int, seq: int, examples: int, device: str) -> Any:
    """The boolean mask of rows that hold ``examples`` sequences each: causal within a sequence,
    nothing across them (True = attend), shaped (batch, 1, seq, seq) as transformers passes it."""
    import torch

    bounds = torch.linspace(0, seq, examples + 1, device=device).long()
    doc = torch.bucketize(torch.arange(seq, device=device), bounds[1:-1], right=True)
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    mask = causal & (doc[:, None] == doc[None, :])
    return mask.expand(batch, 1, seq, seq)


def calls(batch: int, seq: int, heads: int, kv_heads: int, head_dim: int, examples: int, device: str
          ) -> dict[str, Any]:
    """The two calls the trainer's attention makes, as closures over fresh bf16 tensors."""
    import torch
    import torch.nn.functional as F

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, kv_heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, kv_heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
    mask = packed_mask(batch, seq, examples, device)
    groups = heads // kv_heads

    def causal() -> Any:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=groups > 1)

    def masked() -> Any:
        kk = k.repeat_interleave(groups, dim=1) if groups > 1 else k
        vv = v.repeat_interleave(groups, dim=1) if groups > 1 else v
        return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)

    return {"causal": causal, "masked": masked, "inputs": (q, k, v)}


def _timed(fn: Any, repeats: int, device: str) -> float:
    import torch

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    times = []
    for _ in range(repeats + 2):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def measure(model: str, shape: tuple[int, int, int], batch: int, seq: int, examples: int, repeats: int,
            device: str) -> dict[str, Any]:
    heads, kv_heads, head_dim = shape
    c = calls(batch, seq, heads, kv_heads, head_dim, examples, device)
    row: dict[str, Any] = {"model": model, "batch": batch, "seq": seq, "heads": heads, "kv_heads": kv_heads,
                           "head_dim": head_dim, "examples": examples}
    # the causal FLOPs the planner counts: QK^T and AV over the lower half, forward; twice that backward
    causal_flops = causal_forward_flops(row)
    for name in ("causal", "masked"):
        fn = c[name]

        def train(fn: Any = fn) -> None:
            fn().sum().backward()

        fwd, both = _timed(fn, repeats, device), _timed(train, repeats, device)
        row[f"{name}_forward_s"], row[f"{name}_train_s"] = fwd, both
        row[f"{name}_train_tflops"] = 3 * causal_flops / both / 1e12
    row["masked_over_causal"] = row["masked_train_s"] / row["causal_train_s"]
    row["masked_over_causal_forward"] = row["masked_forward_s"] / row["causal_forward_s"]
    return row


def causal_forward_flops(row: dict[str, Any]) -> float:
    """The causal FLOPs of one call's forward, as the planner counts them (QK^T and AV over the
    lower half of the square)."""
    return 2.0 * row["batch"] * row["heads"] * row["seq"] ** 2 * row["head_dim"]


def fit(rows: list[dict[str, Any]], matmul_tflops: float) -> dict[str, float]:
    """The masked call's constants from a report's rows: ``masked_train_s = call + 3 F / rate``
    (F: the causal forward FLOPs; one rate per head-dimension band, one call time), least squares on
    the relative error; the forward's share of the call is the median over the rows."""
    import numpy as np

    bands = sorted({head_dim_band(r["head_dim"]) for r in rows})
    design = np.array([[3 * causal_forward_flops(r) if head_dim_band(r["head_dim"]) == b else 0.0
                        for b in bands] + [1.0] for r in rows])
    seconds = np.array([r["masked_train_s"] for r in rows])
    coef = np.linalg.lstsq(design / seconds[:, None], np.ones(len(rows)), rcond=None)[0]
    out = {f"rate_fraction_{b}": float(1 / coef[i] / (matmul_tflops * 1e12)) for i, b in enumerate(bands)}
    out["call_seconds"] = float(coef[-1])
    out["forward_share"] = statistics.median(r["masked_forward_s"] / r["masked_train_s"] for r in rows)
    return out


def masked_seconds(row: dict[str, Any], constants: dict[str, float], matmul_tflops: float) -> float:
    """One call's forward and backward as ``fit``'s model has it."""
    rate = constants[f"rate_fraction_{head_dim_band(row['head_dim'])}"] * matmul_tflops * 1e12
    return constants["call_seconds"] + 3 * causal_forward_flops(row) / rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fit", type=Path, metavar="REPORT", help="print the planner's constants from a report")
    ap.add_argument("--matmul-tflops", type=float, help="the card's bf16 matmul rate (with --fit)")
    ap.add_argument("--model", nargs="+", default=DEFAULT_MODELS, choices=sorted(MODELS))
    ap.add_argument("--seq", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--examples", type=int, default=2, help="sequences packed into each row")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    if args.fit:
        if not args.matmul_tflops:
            ap.error("--fit needs --matmul-tflops")
        rows = json.loads(args.fit.read_text())["rows"]
        constants = fit(rows, args.matmul_tflops)
        print(json.dumps(constants, indent=1))
        for r in rows:
            err = masked_seconds(r, constants, args.matmul_tflops) / r["masked_train_s"] - 1
            print(r["model"], r["batch"], r["seq"], f"{err:+.1%}")
        return 0
    if not args.out:
        ap.error("--out is needed")
    import torch

    rows = [measure(m, shape, b, s, args.examples, args.repeats, args.device)
            for m, shape in attention_shapes(args.model).items() for s in args.seq for b in args.batch]
    report = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": rows,
        "median_masked_over_causal": statistics.median(r["masked_over_causal"] for r in rows),
    }
    args.out.write_text(json.dumps(report, indent=1))
    for r in rows:
        print(r["model"], r["batch"], r["seq"], f"{r['masked_over_causal']:.2f}",
              f"{r['causal_train_tflops']:.0f}", f"{r['masked_train_tflops']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
