"""What bitsandbytes' 4-bit linear costs in a training step, against the bf16 linear it replaces.

For every distinct weight shape of the named models' decoder layers and each token count, times on
the GPU a frozen ``nn.Linear`` in bf16 and bitsandbytes' ``Linear4bit`` as the trainer quantises
(NF4, double quantisation, bf16 compute): the forward, and the backward that only needs the input's
gradient (LoRA freezes the base weight). Each figure is the median of ``--repeats`` CUDA-synchronised
wall-clock timings, so it holds the host's launch work as well as the kernels'; ``host_s`` is the
host's share alone (the call returns before the GPU is done: time from the call to its return, with
a long GPU job queued ahead of it).

    python3 -m bench.qlora_kernels --out qlora-kernels.json [--model qwen2.5-7b ...] [--tokens 512 2048 8192]
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

DEFAULT_MODELS = ["qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3.2-3b", "qwen2.5-7b", "mistral-7b-v0.3"]


def shapes(models: list[str]) -> list[tuple[int, int]]:
    """The distinct (in, out) of the decoder layers' linears of ``models``."""
    found = {(lin.in_features, lin.out_features)
             for m in models for lin in arch_from_config(MODELS[m]).linears}
    return sorted(found, key=lambda s: s[0] * s[1])


def _timed(fn: Any, repeats: int) -> float:
    import torch

    times = []
    for _ in range(repeats + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def _host(fn: Any, repeats: int) -> float:
    """Seconds the host spends in ``fn`` while the GPU is still busy with earlier work."""
    import torch

    block = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(repeats + 2):
        torch.cuda.synchronize()
        for _ in range(8):  # ~10 ms of GPU work queued ahead
            block @ block
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times[2:])


def measure(in_f: int, out_f: int, tokens: int, repeats: int) -> dict[str, Any]:
    import bitsandbytes as bnb
    import torch

    dense = torch.nn.Linear(in_f, out_f, bias=False, dtype=torch.bfloat16, device="cuda")
    dense.requires_grad_(False)
    quant = bnb.nn.Linear4bit(in_f, out_f, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4",
                              compress_statistics=True)
    quant = quant.cuda().requires_grad_(False)
    x = torch.randn(tokens, in_f, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(tokens, out_f, device="cuda", dtype=torch.bfloat16)
    row: dict[str, Any] = {"in_features": in_f, "out_features": out_f, "tokens": tokens}
    for name, layer in (("bf16", dense), ("nf4", quant)):
        row[f"{name}_forward_s"] = _timed(lambda layer=layer: layer(x), repeats)

        def fwd_bwd(layer: Any = layer) -> None:
            layer(x).backward(grad)
            x.grad = None

        row[f"{name}_forward_backward_s"] = _timed(fwd_bwd, repeats)
        row[f"{name}_forward_host_s"] = _host(lambda layer=layer: layer(x), repeats)
        row[f"{name}_forward_backward_host_s"] = _host(fwd_bwd, repeats)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", action="append", choices=sorted(MODELS))
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    import bitsandbytes as bnb
    import torch

    rows = []
    for in_f, out_f in shapes(args.model or DEFAULT_MODELS):
        for tokens in args.tokens:
            rows.append(measure(in_f, out_f, tokens, args.repeats))
            torch.cuda.empty_cache()
    report = {"gpu_name": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "bitsandbytes": bnb.__version__, "models": args.model or DEFAULT_MODELS, "rows": rows}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for r in rows:
        print(f"{r['in_features']:>6}x{r['out_features']:<6} T={r['tokens']:<5} fwd+bwd bf16 "
              f"{r['bf16_forward_backward_s'] * 1e6:8.0f} us nf4 {r['nf4_forward_backward_s'] * 1e6:8.0f} us "
              f"host nf4 {r['nf4_forward_backward_host_s'] * 1e6:6.0f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
