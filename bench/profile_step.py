"""Where one training step's time goes: GPU kernel time against wall time, kernel launches, and the
kernels and host operations that take the most, for a model of ``bench/cases.py`` built from its
config (random weights) and trained with plain PyTorch (bf16 weights, fused AdamW, no DeepSpeed), or,
with a ZeRO stage (``--zero-stage`` or a case's sixth field ``z0``-``z3``), by DeepSpeed's engine in
this one process on the plan's DeepSpeed config (no offload), to see what the engine adds.

The step-time model (planner/speed.py) puts a micro-step between a GPU clock (FLOPs at a rate) and
a host clock (per-layer Python and launches); this shows, for one configuration, how busy the GPU
was and with what. Run from the repository root on a GPU box:
``python3 -m bench.profile_step gemma-2-2b lora --seq 2048 --micro-batch 2 [--checkpointing]``
prints one JSON object per configuration; several ``--case MODEL:METHOD:SEQ:MB:CKPT[:zN]`` run in
one process one after the other.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any

from bench.cases import MODELS

#: Steps run before the profiled ones (allocator and autotuning warm-up), and profiled steps.
WARMUP_STEPS = 3
PROFILED_STEPS = 3
TOP = 12


def _model(name: str, method: str, checkpointing: bool, on_gpu: bool = True) -> Any:
    """The model as the service's trainer builds it (``bench.step_kernels.build``): random weights
    from the config, bf16, on the GPU (``on_gpu``; else where the context puts it: under ZeRO-3's
    ``zero.Init``, partitioned), the attention the planner resolves for it, checkpointing and the
    default LoRA adapter."""
    from bench.step_kernels import attention_for, build

    return build(name, int(MODELS[name]["num_hidden_layers"]), method, attention_for(name, "auto"),
                 checkpointing, device="cuda" if on_gpu else None)


_KEEP_ALIVE: list[Any] = []  # HfDeepSpeedConfig must outlive model construction (weakref inside HF)


def _engine(name: str, method: str, seq: int, micro_batch: int, checkpointing: bool, stage: int) -> Any:
    """DeepSpeed's engine over the model, one rank, the plan's DeepSpeed config of the case."""
    import os

    import deepspeed
    import torch

    from bench.cases import make_case
    from bench.measure import build_ds_config

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
        os.environ.setdefault(key, value)
    torch.cuda.set_device(0)
    spec = make_case(name, method, stage, "none", checkpointing, seq, micro_batch, 1).spec
    ds_config = build_ds_config(spec)
    deepspeed.init_distributed()
    if stage == 3:
        from transformers.integrations.deepspeed import HfDeepSpeedConfig

        _KEEP_ALIVE.append(HfDeepSpeedConfig(ds_config))  # type: ignore[no-untyped-call]
    model = _model(name, method, checkpointing, on_gpu=stage != 3)
    engine, *_ = deepspeed.initialize(model=model, config=ds_config,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad])
    return engine


def profile(name: str, method: str, seq: int, micro_batch: int, checkpointing: bool,
            stage: int | None = None) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    _KEEP_ALIVE.clear()  # an earlier ZeRO-3 case's, under which this case's model would be partitioned
    if stage is None:
        model = _model(name, method, checkpointing)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-5, fused=True)
    else:
        engine = _engine(name, method, seq, micro_batch, checkpointing, stage)
        model = engine.module
    vocab = int(model.config.vocab_size)

    def step() -> None:
        ids = torch.randint(0, vocab, (micro_batch, seq), device="cuda")
        if stage is not None:
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
            return
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def timed_steps() -> list[float]:
        walls = []
        for _ in range(PROFILED_STEPS):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
        return walls

    for _ in range(WARMUP_STEPS):
        step()
    torch.cuda.synchronize()
    plain = timed_steps()  # the same steps without the profiler, whose own hooks slow the host
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        walls = timed_steps()
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    kernels = sorted((e for e in events if e.device_type.name == "CUDA"),
                     key=lambda e: -e.self_device_time_total)
    host_ops = sorted((e for e in events if e.device_type.name == "CPU"),
                      key=lambda e: -e.self_cpu_time_total)
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC",
                                                       "cuLaunchKernel", "cuLaunchKernelEx"))
    result = {
        "case": f"{name}|{method}|s{seq}|mb{micro_batch}|{'ckpt' if checkpointing else 'nockpt'}"
                + ("" if stage is None else f"|deepspeed-z{stage}"),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "wall_s_per_step": round(sum(walls) / len(walls), 4),
        "unprofiled_wall_s_per_step": round(sum(plain) / len(plain), 4),
        "gpu_kernel_s_per_step": round(device_us / 1e6 / PROFILED_STEPS, 4),
        "kernel_launches_per_step": launches // PROFILED_STEPS,
        "top_kernels_ms_per_step": [[e.key[:90], round(e.self_device_time_total / 1e3 / PROFILED_STEPS, 2),
                                     e.count // PROFILED_STEPS] for e in kernels[:TOP]],
        "top_host_ops_ms_per_step": [[e.key[:60], round(e.self_cpu_time_total / 1e3 / PROFILED_STEPS, 2),
                                      e.count // PROFILED_STEPS] for e in host_ops[:TOP]],
    }
    return result


def _parse_case(text: str) -> tuple[str, str, int, int, bool, int | None]:
    fields = text.split(":")
    stage = int(fields[5].removeprefix("z")) if len(fields) > 5 else None
    return fields[0], fields[1], int(fields[2]), int(fields[3]), fields[4] == "ckpt", stage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", choices=sorted(MODELS))
    parser.add_argument("method", nargs="?", choices=("lora", "full"))
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3),
                        help="train through DeepSpeed's engine at this ZeRO stage")
    parser.add_argument("--case", action="append", default=[],
                        help="MODEL:METHOD:SEQ:MICRO_BATCH:ckpt|nockpt[:z0-z3], repeatable")
    args = parser.parse_args(argv)
    cases = [_parse_case(c) for c in args.case]
    if args.model and args.method:
        cases.insert(0, (args.model, args.method, args.seq, args.micro_batch, args.checkpointing,
                         args.zero_stage))
    if not cases:
        parser.error("give MODEL METHOD or at least one --case")
    for case in cases:
        print(json.dumps(profile(*case)), flush=True)
        gc.collect()  # the case's model and optimizer went out of scope with profile()
        import torch

        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
