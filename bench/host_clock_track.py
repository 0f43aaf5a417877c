"""Whether the box probe's host-clock reading follows the speed of a host-bound training step on the
same box over a few minutes.

The service plans a job's step with one probe of its box (``tunebox.hostclock``, read when the worker
starts and again when the figure is old). This builds one DeepSpeed engine (``bench.profile_step``'s:
the plan's DeepSpeed config, random weights) and then, round after round, reads the probe in a child
process exactly as the worker does and times a few steps of the engine, so that each round has a
probe figure and a step time taken a moment apart. Run from the repository root on a GPU box:

    python3 -m bench.host_clock_track --case qwen2.5-0.5b:full:2048:4:ckpt:z3 --rounds 10 --out track.jsonl

Writes one JSON line per round (probe figures, median step seconds) and a last line with the
Pearson correlation of log step time against log probe time over the rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.profile_step import _engine, _parse_case


def correlation(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r of two equally long series; None for fewer than three pairs or a constant one."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / (sx * sy)


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' spread and how the step followed each probe figure (log against log)."""
    steps = [math.log(r["step_seconds"]) for r in rounds]
    out: dict[str, Any] = {"rounds": len(rounds),
                           "step_seconds_range": [min(r["step_seconds"] for r in rounds),
                                                  max(r["step_seconds"] for r in rounds)]}
    for key in ("hooked_module_us", "python_loop_1000_us", "tensor_op_us"):
        values = [r["probe"][key] for r in rounds]
        out[f"{key}_range"] = [min(values), max(values)]
        r = correlation([math.log(v) for v in values], steps)
        out[f"r_log_step_vs_log_{key}"] = None if r is None else round(r, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    from tunebox.hostclock import _probe_in_child

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help="MODEL:METHOD:SEQ:MICRO_BATCH:ckpt|nockpt:zN")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=4, help="timed steps a round")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    name, method, seq, micro_batch, checkpointing, stage = _parse_case(args.case)
    if stage is None:
        parser.error("the case needs a ZeRO stage (its sixth field, z0-z3)")
    engine = _engine(name, method, seq, micro_batch, checkpointing, stage)
    vocab = int(engine.module.config.vocab_size)

    def step() -> float:
        ids = torch.randint(0, vocab, (micro_batch, seq), device="cuda")
        t0 = time.perf_counter()
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(3):  # the allocator's and the kernels' warm-up
        step()
    rounds = []
    with args.out.open("w") as fh:
        for i in range(args.rounds):
            probe = _probe_in_child("cuda")
            times = [step() for _ in range(args.steps)]
            row = {"case": args.case, "round": i, "probe": probe, "step_seconds": statistics.median(times),
                   "steps": [round(t, 4) for t in times]}
            rounds.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(json.dumps(row), flush=True)
        fh.write(json.dumps({"summary": summary(rounds)}) + "\n")
    print(json.dumps({"summary": summary(rounds)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
