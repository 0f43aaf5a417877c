"""The field report's cases through the whole service on a GPU box, each phase under a per-card limit.

Builds random-init models of published shapes (saved in bf16, as real ones are) and a long-row
alpaca file, then for each phase starts ``tunebox serve`` on its embedded default with the phase's
``TUNEBOX_GPU_MEMORY_LIMIT_BYTES`` (none: the whole card), submits the phase's jobs at once through
the REST API (the leases pack those whose planned peaks fit together on one card), waits for
them, and records per job: the plan (or the refusal with its alternatives), the status history and
every "planned again" event, and what the service's own trainer and worker measured: NVML peak of
the process, PyTorch's reserved and allocated peaks, host RSS, tokens/s.

    python3 -m bench.field_cases --out report.json --phase pack --phase limit10 [--steps 8]

``--list`` prints the phases and their jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import httpx

from bench.service_gpu import (
    REPO,
    archived_progress,
    build_dataset,
    build_model,
    free_port,
    progress_lines,
    steady_step_seconds,
    steady_tokens_per_second,
    stop_serve,
    tunebox,
    wait_ready,
)

GIB = 2**30
TERMINAL = ("succeeded", "failed", "cancelled")
ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
AUTO = {"num_gpus": "auto", "zero_stage": "auto", "offload_optimizer": "auto", "offload_param": "auto"}
#: the field report's headline configuration: ZeRO-3, optimizer and parameters on the CPU
FIELD_REPORT = {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}
ONE_GPU = {"num_gpus": 1, "offload_optimizer": "none", "offload_param": "none"}
Z0 = ONE_GPU | {"zero_stage": 0}
#: ZeRO-3 on one GPU with the optimizer on the CPU
Z3_OFFOPT = ONE_GPU | {"zero_stage": 3, "offload_optimizer": "cpu"}
#: ZeRO-2 on one GPU with the optimizer on the CPU
OFFOPT_Z2 = ONE_GPU | {"zero_stage": 2, "offload_optimizer": "cpu"}


def job(name: str, model: str, method: str, resources: dict[str, Any], *, seq_len: int = 1024,
        micro: int | str = "auto", accumulation: int = 8, checkpointing: bool | str = "auto",
        targets: list[str] | None = None, optimizer: str = "adamw", alternative: int = 0,
        chunk: int | str | None = None, rank: int = 16) -> dict[str, Any]:
    """A job of a phase. ``alternative=k`` runs the k-th alternative of the plan the service makes
    for this spec (every configuration field pinned as that alternative has it) instead of its choice;
    ``chunk`` is its ``training.loss_chunk_tokens``, ``rank`` its LoRA rank (alpha twice that)."""
    training = {"micro_batch_size": micro, "gradient_accumulation_steps": accumulation, "seq_len": seq_len,
                "gradient_checkpointing": checkpointing, "optimizer": optimizer}
    if chunk is not None:
        training["loss_chunk_tokens"] = chunk
    return {"name": name, "model": model, "method": method,
            "lora": {"r": rank, "alpha": 2 * rank, "dropout": 0.05,
                     "target_modules": targets or ALL_PROJECTIONS},
            "training": training, "resources": resources,
            **({"alternative": alternative} if alternative else {})}


def zero0_full(name: str, model: str, seq_len: int, micro: int, optimizer: str) -> dict[str, Any]:
    """A full fine-tune under ZeRO-0 on one GPU, one micro-batch a step, with checkpointing."""
    return job(name, model, "full", Z0, seq_len=seq_len, micro=micro, accumulation=1, checkpointing=True,
               optimizer=optimizer)


def ranked(name: str, model: str, method: str, *, alternatives: int = 2, **kw: Any) -> list[dict[str, Any]]:
    """The plan's choice for an all-"auto" job and its next ``alternatives`` configurations."""
    return [job(f"{name}-auto", model, method, AUTO, **kw)] + [
        job(f"{name}-alt{k}", model, method, AUTO, alternative=k, **kw) for k in range(1, alternatives + 1)]


def pin_alternative(body: dict[str, Any], plan: dict[str, Any], k: int) -> dict[str, Any]:
    """``body`` with every configuration field as the plan's k-th alternative has it."""
    from planner.dsconfig import ZERO_KNOBS

    resolved = plan["resolved"]
    zero = (plan.get("deepspeed_config") or {}).get("zero_optimization") or {}
    out = {**body, "resources": {**body["resources"], **{f: resolved[f] for f in PINNED},
                                 "deepspeed": {f: v for f, v in zero.items() if f in ZERO_KNOBS}},
           "training": {**body["training"], **{f: resolved[f] for f in (
               "micro_batch_size", "gradient_accumulation_steps", "gradient_checkpointing")}}}
    for dotted, value in plan["alternatives"][k - 1]["changes"].items():
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        node[leaf] = value
    return out


#: heldout11's jobs (a list of its own: heldout11-alone runs one of them as defined here)
HELDOUT11 = [
    job("lora-llama3b-z3-s4096-mb2", "llama-3.2-3b", "lora", ONE_GPU | {"zero_stage": 3}, seq_len=4096,
        micro=2, accumulation=1, checkpointing=True),
    job("full-llama1b-z3-s1024-mb8", "llama-3.2-1b", "full", ONE_GPU | {"zero_stage": 3}, seq_len=1024,
        micro=8, accumulation=1, checkpointing=True),
    job("qlora-mistral7b-z1-s4096-mb2", "mistral-7b-v0.3", "qlora", ONE_GPU | {"zero_stage": 1},
        seq_len=4096, micro=2, accumulation=1, checkpointing=True),
    job("lora-gemma2-2b-z2-s2048-mb4", "gemma-2-2b", "lora", ONE_GPU | {"zero_stage": 2}, seq_len=2048,
        micro=4, accumulation=1, checkpointing=True),
    job("full-qwen1.5b-z1-s2048-mb4", "qwen2.5-1.5b", "full", ONE_GPU | {"zero_stage": 1}, seq_len=2048,
        micro=4, accumulation=1, checkpointing=True),
    job("lora-qwen7b-z2-offopt-s4096-mb2", "qwen2.5-7b", "lora",
        {"num_gpus": 1, "zero_stage": 2, "offload_optimizer": "cpu", "offload_param": "none"},
        seq_len=4096, micro=2, accumulation=1, checkpointing=True),
]

#: phase -> (per-card limit in GiB or None, jobs)
PHASES: dict[str, tuple[float | None, list[dict[str, Any]]]] = {
    # two 1.5B LoRA jobs that the leases pack onto one card, each held to its plan
    "pack": (None, [
        job(f"lora-1.5b-z2-{i}", "qwen2.5-1.5b", "lora",
            {"num_gpus": 1, "zero_stage": 2, "offload_optimizer": "none", "offload_param": "none"},
            seq_len=2048, micro=2, accumulation=1, checkpointing=True,
            targets=["q_proj", "k_proj", "v_proj", "o_proj"])
        for i in (1, 2)]),
    # the field report's own configurations pinned, measured on the whole card
    "pinned": (None, [
        job("lora-7b-field-report", "qwen2.5-7b", "lora", FIELD_REPORT, micro=1, accumulation=1,
            checkpointing=True),
        job("qlora-7b-z0", "qwen2.5-7b", "qlora",
            {"num_gpus": 1, "zero_stage": 0, "offload_optimizer": "none", "offload_param": "none"},
            micro=1, accumulation=1, checkpointing=True),
    ]),
    # every resource "auto" under a 10 GiB and a 24 GiB card
    "limit10": (10, [job("lora-7b-auto-10g", "qwen2.5-7b", "lora", AUTO),
                     job("qlora-7b-auto-10g", "qwen2.5-7b", "qlora", AUTO)]),
    "limit24": (24, [job("lora-7b-auto-24g", "qwen2.5-7b", "lora", AUTO),
                     job("full-1.5b-auto-24g", "qwen2.5-1.5b", "full", AUTO)]),
    # the headline and QLoRA under 10 GiB to the end (short steps), QLoRA's next two alternatives
    "ranked10": (10, [job("lora-7b-10g-auto", "qwen2.5-7b", "lora", AUTO, accumulation=2)]
                 + ranked("qlora-7b-10g", "qwen2.5-7b", "qlora", accumulation=2)),
    # 7B QLoRA under 10 GiB (ZeRO-3 is not QLoRA's): the refusal and its first alternative
    "qlora-z0": (None, [job("qlora-7b-z0", "qwen2.5-7b", "qlora", ONE_GPU | {"zero_stage": 0}, micro=1,
                            accumulation=1, checkpointing=True)]),
    "qlora10": (10, ranked("qlora-7b-10g", "qwen2.5-7b", "qlora", alternatives=1, accumulation=2)),
    # the search's choice against its next two alternatives, each run alone under the card limit
    "ranked24": (24, ranked("lora-7b-24g", "qwen2.5-7b", "lora", accumulation=4)),
    "ranked40": (40, ranked("full-1.5b-40g", "qwen2.5-1.5b", "full", accumulation=4)),
    # two 7B LoRA jobs of ranked24's choice that the leases pack onto the one card at once
    "pack7b": (None, [
        job(f"lora-7b-z0-{i}", "qwen2.5-7b", "lora",
            {"num_gpus": 1, "zero_stage": 0, "offload_optimizer": "none", "offload_param": "none"},
            micro=2, accumulation=2, checkpointing=True) for i in (1, 2)]),
    # configurations no record had: QLoRA, 8-bit AdamW and Lion, Gemma 2 at 4096, an 8B model
    "heldout2": (None, [
        job("qlora-1.5b-z0-mb4-s2048", "qwen2.5-1.5b", "qlora", ONE_GPU | {"zero_stage": 0}, seq_len=2048,
            micro=4, accumulation=1, checkpointing=True),
        job("lora-llama3b-z1-adamw8bit", "llama-3.2-3b", "lora", ONE_GPU | {"zero_stage": 1}, seq_len=1024,
            micro=4, accumulation=1, checkpointing=True, optimizer="adamw_8bit"),
        job("full-1.5b-z2-lion", "qwen2.5-1.5b", "full", ONE_GPU | {"zero_stage": 2}, seq_len=1024, micro=4,
            accumulation=1, checkpointing=True, optimizer="lion"),
        job("lora-gemma2-2b-z3-s4096", "gemma-2-2b", "lora", ONE_GPU | {"zero_stage": 3}, seq_len=4096,
            micro=2, accumulation=1, checkpointing=True),
    ]),
    "heldout3": (None, [
        job("qlora-mistral7b-z0-s2048", "mistral-7b-v0.3", "qlora", ONE_GPU | {"zero_stage": 0},
            seq_len=2048, micro=1, accumulation=1, checkpointing=True),
        job("lora-llama8b-z2-optoff-s2048", "llama-3.1-8b", "lora",
            ONE_GPU | {"zero_stage": 2, "offload_optimizer": "cpu"}, seq_len=2048, micro=2, accumulation=1,
            checkpointing=True),
    ]),
    # LoRA with the parameters offloaded on one GPU, across vocabularies, tying and sequences
    "offload1": (None, [
        job("lora-7b-z3-offload-s2048", "qwen2.5-7b", "lora", FIELD_REPORT, seq_len=2048, micro=1,
            accumulation=1, checkpointing=True),
        job("lora-1.5b-z3-offload-s2048", "qwen2.5-1.5b", "lora", FIELD_REPORT, seq_len=2048, micro=2,
            accumulation=1, checkpointing=True, targets=["q_proj", "k_proj", "v_proj", "o_proj"]),
        job("lora-llama3b-z3-offload-s1024", "llama-3.2-3b", "lora", FIELD_REPORT, seq_len=1024, micro=2,
            accumulation=1, checkpointing=True),
        job("lora-mistral7b-z3-offload-s2048", "mistral-7b-v0.3", "lora", FIELD_REPORT, seq_len=2048,
            micro=1, accumulation=1, checkpointing=True, targets=["q_proj", "k_proj", "v_proj", "o_proj"]),
    ]),
    # QLoRA's step time across sizes, tokens per micro-step and checkpointing, with a LoRA twin of one
    "qlora-steps": (None, [
        job("qlora-0.5b-s2048-mb8", "qwen2.5-0.5b", "qlora", Z0, seq_len=2048, micro=8, accumulation=1,
            checkpointing=True),
        job("qlora-1.5b-s512-mb1-nockpt", "qwen2.5-1.5b", "qlora", Z0, seq_len=512, micro=1, accumulation=1,
            checkpointing=False),
        job("qlora-1.5b-s2048-mb4", "qwen2.5-1.5b", "qlora", Z0, seq_len=2048, micro=4, accumulation=1,
            checkpointing=True),
        job("qlora-llama3b-s1024-mb2", "llama-3.2-3b", "qlora", Z0, micro=2, accumulation=1,
            checkpointing=True),
        job("qlora-7b-s512-mb1-nockpt", "qwen2.5-7b", "qlora", Z0, seq_len=512, micro=1, accumulation=1,
            checkpointing=False),
        job("qlora-7b-s4096-mb1", "qwen2.5-7b", "qlora", Z0, seq_len=4096, micro=1, accumulation=1,
            checkpointing=True),
        job("qlora-7b-s1024-mb8", "qwen2.5-7b", "qlora", Z0, micro=8, accumulation=1, checkpointing=True),
        job("qlora-mistral7b-z2-s1024-mb2", "mistral-7b-v0.3", "qlora", ONE_GPU | {"zero_stage": 2}, micro=2,
            accumulation=1, checkpointing=True),
        job("lora-7b-s1024-mb1", "qwen2.5-7b", "lora", Z0, micro=1, accumulation=1, checkpointing=True),
    ]),
    # configurations no QLoRA step-time record has, for the planner that qlora-steps shaped
    "qlora-steps-heldout": (None, [
        job("qlora-gemma2-2b-s2048-mb2", "gemma-2-2b", "qlora", Z0, seq_len=2048, micro=2, accumulation=1,
            checkpointing=True),
        job("qlora-3b-z1-s1024-mb4", "qwen2.5-3b", "qlora", ONE_GPU | {"zero_stage": 1}, micro=4,
            accumulation=1, checkpointing=True),
        job("qlora-llama1b-s4096-mb2-nockpt", "llama-3.2-1b", "qlora", Z0, seq_len=4096, micro=2,
            accumulation=1, checkpointing=False),
        job("qlora-7b-s8192-mb1", "qwen2.5-7b", "qlora", Z0, seq_len=8192, micro=1, accumulation=1,
            checkpointing=True),
        job("qlora-0.5b-s512-mb16-nockpt", "qwen2.5-0.5b", "qlora", Z0, seq_len=512, micro=16, accumulation=1,
            checkpointing=False),
        job("qlora-llama8b-s2048-mb2x2", "llama-3.1-8b", "qlora", Z0, seq_len=2048, micro=2, accumulation=2,
            checkpointing=True),
        job("qlora-1.5b-z2-s1024-mb8-qv", "qwen2.5-1.5b", "qlora", ONE_GPU | {"zero_stage": 2}, micro=8,
            accumulation=1, checkpointing=True, targets=["q_proj", "v_proj"]),
        job("qlora-7b-s2048-mb2-adamw8bit", "qwen2.5-7b", "qlora", Z0, seq_len=2048, micro=2, accumulation=1,
            checkpointing=True, optimizer="adamw_8bit"),
    ]),
    # configurations no record has, for the planner with the QLoRA step and the trainer's host figure
    "heldout4": (None, [
        job("qlora-3b-z2-optoff-s2048-mb2", "qwen2.5-3b", "qlora", ONE_GPU | {"zero_stage": 2,
            "offload_optimizer": "cpu"}, seq_len=2048, micro=2, accumulation=1, checkpointing=True),
        job("lora-llama1b-z1-s2048-mb4", "llama-3.2-1b", "lora", ONE_GPU | {"zero_stage": 1}, seq_len=2048,
            micro=4, accumulation=1, checkpointing=True),
        job("full-0.5b-z1-s2048-mb4", "qwen2.5-0.5b", "full", ONE_GPU | {"zero_stage": 1}, seq_len=2048,
            micro=4, accumulation=1, checkpointing=True),
        job("qlora-llama3b-s8192-mb1-lion", "llama-3.2-3b", "qlora", Z0, seq_len=8192, micro=1,
            accumulation=1, checkpointing=True, optimizer="lion"),
        job("lora-gemma2-2b-z2-s1024-mb8", "gemma-2-2b", "lora", ONE_GPU | {"zero_stage": 2}, micro=8,
            accumulation=1, checkpointing=True),
        job("lora-1.5b-z3-offload-s2048-mb4", "qwen2.5-1.5b", "lora", FIELD_REPORT, seq_len=2048, micro=4,
            accumulation=1, checkpointing=True),
        job("lora-3b-z0-s4096-mb2-nockpt", "qwen2.5-3b", "lora", Z0, seq_len=4096, micro=2, accumulation=1,
            checkpointing=False),
        job("full-llama1b-z2-optoff-s1024-mb4", "llama-3.2-1b", "full", ONE_GPU | {"zero_stage": 2,
            "offload_optimizer": "cpu"}, micro=4, accumulation=2, checkpointing=True),
    ]),
    # the service's own calibration set: configurations of the 2026-12-01/02 reports, whose trainer held
    # the model's output (its bf16 logits) through backward, measured with the trainer in the tree
    "current": (None, [
        job("lora-7b-field-report", "qwen2.5-7b", "lora", FIELD_REPORT, micro=1, accumulation=1,
            checkpointing=True),
        job("lora-7b-z3-paramoff-mb2", "qwen2.5-7b", "lora",
            ONE_GPU | {"zero_stage": 3, "offload_param": "cpu"}, micro=2, accumulation=2, checkpointing=True),
        job("lora-7b-z0-mb2x2", "qwen2.5-7b", "lora", Z0, micro=2, accumulation=2, checkpointing=True),
        job("lora-1.5b-z2-s2048-mb2", "qwen2.5-1.5b", "lora", ONE_GPU | {"zero_stage": 2}, seq_len=2048,
            micro=2, accumulation=1, checkpointing=True, targets=["q_proj", "k_proj", "v_proj", "o_proj"]),
        job("lora-1.5b-z3-offload-s2048", "qwen2.5-1.5b", "lora", FIELD_REPORT, seq_len=2048, micro=2,
            accumulation=1, checkpointing=True, targets=["q_proj", "k_proj", "v_proj", "o_proj"]),
        job("full-0.5b-z1-optoff-s1024-mb4", "qwen2.5-0.5b", "full", ONE_GPU | {"zero_stage": 1,
            "offload_optimizer": "cpu"}, micro=4, accumulation=1, checkpointing=True),
        job("full-0.5b-z3-s1024-mb4", "qwen2.5-0.5b", "full", ONE_GPU | {"zero_stage": 3}, micro=4,
            accumulation=1, checkpointing=True),
        job("lora-llama3b-z1-adamw8bit", "llama-3.2-3b", "lora", ONE_GPU | {"zero_stage": 1}, micro=4,
            accumulation=1, checkpointing=True, optimizer="adamw_8bit"),
        job("lora-llama8b-z2-optoff-s2048", "llama-3.1-8b", "lora", ONE_GPU | {"zero_stage": 2,
            "offload_optimizer": "cpu"}, seq_len=2048, micro=2, accumulation=1, checkpointing=True),
    ]),
    # more configurations no record has: full fine-tuning under ZeRO-3 and ZeRO-0 (16 x 512), Gemma 2
    # without checkpointing
    "heldout5": (None, [
        job("full-llama1b-z3-s2048-mb2", "llama-3.2-1b", "full", ONE_GPU | {"zero_stage": 3}, seq_len=2048,
            micro=2, accumulation=1, checkpointing=True),
        job("full-0.5b-z0-s512-mb16-nockpt", "qwen2.5-0.5b", "full", Z0, seq_len=512, micro=16,
            accumulation=1, checkpointing=False),
        job("lora-gemma2-2b-z1-s2048-mb2-nockpt", "gemma-2-2b", "lora", ONE_GPU | {"zero_stage": 1},
            seq_len=2048, micro=2, accumulation=1, checkpointing=False),
    ]),
    # configurations no record has, for the planner whose SDPA keeps a mask and expanded k/v in every
    # layer of rows that pack or pad, and whose trainer runs the attention it planned (Gemma 2: eager)
    "heldout6": (None, [
        job("lora-gemma2-2b-z1-s2048-mb2-nockpt-eager", "gemma-2-2b", "lora", ONE_GPU | {"zero_stage": 1},
            seq_len=2048, micro=2, accumulation=1, checkpointing=False),
        job("qlora-mistral7b-z0-s4096-mb1-nockpt", "mistral-7b-v0.3", "qlora", Z0, seq_len=4096, micro=1,
            accumulation=1, checkpointing=False),
        job("lora-1.5b-z0-s4096-mb2-nockpt", "qwen2.5-1.5b", "lora", Z0, seq_len=4096, micro=2,
            accumulation=1, checkpointing=False),
        job("lora-llama8b-z1-s8192-mb1", "llama-3.1-8b", "lora", ONE_GPU | {"zero_stage": 1}, seq_len=8192,
            micro=1, accumulation=1, checkpointing=True),
        job("full-llama1b-z3-s2048-mb2", "llama-3.2-1b", "full", ONE_GPU | {"zero_stage": 3}, seq_len=2048,
            micro=2, accumulation=1, checkpointing=True),
        job("lora-llama3b-z2-optoff-s4096-mb2", "llama-3.2-3b", "lora", ONE_GPU | {"zero_stage": 2,
            "offload_optimizer": "cpu"}, seq_len=4096, micro=2, accumulation=1, checkpointing=True),
    ]),
    # configurations no record has, for the planner after heldout6 (long masked rows, offload of both
    # kinds, 8-bit AdamW under QLoRA, a small full fine-tune without checkpointing)
    "heldout7": (None, [
        job("lora-7b-z2-s8192-mb1", "qwen2.5-7b", "lora", ONE_GPU | {"zero_stage": 2}, seq_len=8192, micro=1,
            accumulation=1, checkpointing=True),
        job("full-0.5b-z0-s4096-mb4-nockpt", "qwen2.5-0.5b", "full", Z0, seq_len=4096, micro=4,
            accumulation=1, checkpointing=False),
        job("lora-mistral7b-z3-offload-s2048-mb2", "mistral-7b-v0.3", "lora", FIELD_REPORT, seq_len=2048,
            micro=2, accumulation=1, checkpointing=True),
        job("qlora-llama3b-z0-s4096-mb2-adamw8bit", "llama-3.2-3b", "qlora", Z0, seq_len=4096, micro=2,
            accumulation=1, checkpointing=True, optimizer="adamw_8bit"),
        job("lora-llama1b-z1-s512-mb16-nockpt", "llama-3.2-1b", "lora", ONE_GPU | {"zero_stage": 1},
            seq_len=512, micro=16, accumulation=1, checkpointing=False),
        job("lora-gemma2-2b-z2-s8192-mb1", "gemma-2-2b", "lora", ONE_GPU | {"zero_stage": 2}, seq_len=8192,
            micro=1, accumulation=1, checkpointing=True),
    ]),
    "heldout8": (None, [
        job("lora-qwen1.5b-z0-s2048-mb4", "qwen2.5-1.5b", "lora", Z0, seq_len=2048, micro=4, accumulation=1,
            checkpointing=True),
        job("full-llama1b-z2-s1024-mb8-nockpt", "llama-3.2-1b", "full", ONE_GPU | {"zero_stage": 2},
            seq_len=1024, micro=8, accumulation=1, checkpointing=False),
        job("lora-gemma2-2b-z0-s4096-mb2", "gemma-2-2b", "lora", Z0, seq_len=4096, micro=2, accumulation=1,
            checkpointing=True),
        job("qlora-qwen3-4b-z0-s2048-mb4", "qwen3-4b", "qlora", Z0, seq_len=2048, micro=4, accumulation=1,
            checkpointing=True),
        job("full-qwen1.5b-z3-offopt-s2048-mb2", "qwen2.5-1.5b", "full",
            {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "none"},
            seq_len=2048, micro=2, accumulation=1, checkpointing=True),
        job("lora-qwen3-4b-z1-s1024-mb8", "qwen3-4b", "lora", ONE_GPU | {"zero_stage": 1}, seq_len=1024,
            micro=8, accumulation=1, checkpointing=True),
    ]),
    "heldout9": (None, [
        job("lora-mistral7b-z0-s4096-mb1", "mistral-7b-v0.3", "lora", Z0, seq_len=4096, micro=1,
            accumulation=1, checkpointing=True),
        job("full-qwen0.5b-z2-s2048-mb8", "qwen2.5-0.5b", "full", ONE_GPU | {"zero_stage": 2}, seq_len=2048,
            micro=8, accumulation=1, checkpointing=True),
        job("lora-gemma2-2b-z1-s2048-mb2-nockpt", "gemma-2-2b", "lora", ONE_GPU | {"zero_stage": 1},
            seq_len=2048, micro=2, accumulation=1, checkpointing=False),
        job("lora-llama3b-z2-s4096-mb2-nockpt", "llama-3.2-3b", "lora", ONE_GPU | {"zero_stage": 2},
            seq_len=4096, micro=2, accumulation=1, checkpointing=False),
        job("qlora-llama3b-z0-s2048-mb8", "llama-3.2-3b", "qlora", Z0, seq_len=2048, micro=8, accumulation=1,
            checkpointing=True),
        job("lora-qwen7b-z3-offopt-s2048-mb2", "qwen2.5-7b", "lora",
            {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "none"},
            seq_len=2048, micro=2, accumulation=1, checkpointing=True),
    ]),
    "heldout10": (None, [
        job("qlora-qwen7b-z0-s4096-mb4", "qwen2.5-7b", "qlora", Z0, seq_len=4096, micro=4, accumulation=1,
            checkpointing=True),
        job("full-qwen0.5b-z3-s4096-mb4", "qwen2.5-0.5b", "full", ONE_GPU | {"zero_stage": 3}, seq_len=4096,
            micro=4, accumulation=1, checkpointing=True),
        job("lora-phi3-z2-s2048-mb4", "phi-3-mini", "lora", ONE_GPU | {"zero_stage": 2}, seq_len=2048,
            micro=4, accumulation=1, checkpointing=True, targets=["qkv_proj", "o_proj"]),
        job("full-qwen0.5b-z3-offopt-s2048-mb8", "qwen2.5-0.5b", "full",
            {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "none"},
            seq_len=2048, micro=8, accumulation=1, checkpointing=True),
        job("lora-llama3b-z3-offload-s4096-mb2", "llama-3.2-3b", "lora", FIELD_REPORT, seq_len=4096, micro=2,
            accumulation=1, checkpointing=True),
        job("lora-qwen3-4b-z3-s2048-mb4", "qwen3-4b", "lora", ONE_GPU | {"zero_stage": 3}, seq_len=2048,
            micro=4, accumulation=1, checkpointing=True),
    ]),
    "heldout11": (None, HELDOUT11),
    # heldout11's full ZeRO-1 job as defined there, alone: beside the phase's other models its
    # checkpoint (23.0 GiB) did not fit the disk left, and the service refused it (422)
    "heldout11-alone": (None, [j for j in HELDOUT11 if j["name"] == "full-qwen1.5b-z1-s2048-mb4"]),
    # unseen ZeRO-3 configurations, one GPU, with the optimizer on the GPU and an uncapped loss, whose
    # first optimizer step's moments fit the fp32 logits block: the loss block the moments take
    # (planner/memory.py, _moments_take_a_loss_block), which the planner of heldout11 counted here
    "heldout12": (None, [
        job("full-qwen0.5b-z3-s2048-mb4", "qwen2.5-0.5b", "full", ONE_GPU | {"zero_stage": 3}, seq_len=2048,
            micro=4, accumulation=1, checkpointing=True),
        job("full-llama1b-z3-s2048-mb4", "llama-3.2-1b", "full", ONE_GPU | {"zero_stage": 3}, seq_len=2048,
            micro=4, accumulation=1, checkpointing=True),
        job("full-qwen1.5b-z3-s1024-mb8", "qwen2.5-1.5b", "full", ONE_GPU | {"zero_stage": 3}, seq_len=1024,
            micro=8, accumulation=1, checkpointing=True),
        job("lora256-llama1b-z3-s1024-mb2", "llama-3.2-1b", "lora", ONE_GPU | {"zero_stage": 3}, seq_len=1024,
            micro=2, accumulation=1, checkpointing=True, rank=256),
    ]),
    # LoRA under ZeRO-3, whose load runs in the process deepspeed.initialize sees (calibration.json,
    # ZERO3_LOADS_IN_THE_INIT_PROCESS): parameters on the GPU, the optimizer on the CPU, both on the
    # CPU; models no LoRA ZeRO-3 record had
    "heldout13": (None, [
        job("lora-qwen1.5b-z3-s2048-mb4", "qwen2.5-1.5b", "lora", ONE_GPU | {"zero_stage": 3}, seq_len=2048,
            micro=4, accumulation=1, checkpointing=True),
        job("lora-mistral7b-z3-s1024-mb2", "mistral-7b-v0.3", "lora", ONE_GPU | {"zero_stage": 3},
            seq_len=1024, micro=2, accumulation=1, checkpointing=True),
        job("lora-llama3b-z3-offopt-s2048-mb2", "llama-3.2-3b", "lora",
            ONE_GPU | {"zero_stage": 3, "offload_optimizer": "cpu"}, seq_len=2048, micro=2, accumulation=1,
            checkpointing=True),
        job("lora-qwen3-4b-z3-offload-s1024-mb2", "qwen3-4b", "lora", FIELD_REPORT, seq_len=1024, micro=2,
            accumulation=1, checkpointing=True),
    ]),
    # configurations no service job had: full fine-tuning under ZeRO-3 with the optimizer and the
    # parameters on the CPU, under ZeRO-2 with the optimizer on the CPU, LoRA under ZeRO-1 with the
    # optimizer on the CPU, and Lion on a full fine-tune at 2 x 8192 under ZeRO-0
    "heldout14": (None, [
        job("full-llama1b-z3-offload-s2048-mb4", "llama-3.2-1b", "full", FIELD_REPORT, seq_len=2048, micro=4,
            accumulation=1, checkpointing=True),
        job("full-qwen1.5b-z2-offopt-s2048-mb4", "qwen2.5-1.5b", "full",
            ONE_GPU | {"zero_stage": 2, "offload_optimizer": "cpu"}, seq_len=2048, micro=4, accumulation=1,
            checkpointing=True),
        job("lora-llama3b-z1-offopt-s4096-mb2", "llama-3.2-3b", "lora",
            ONE_GPU | {"zero_stage": 1, "offload_optimizer": "cpu"}, seq_len=4096, micro=2, accumulation=1,
            checkpointing=True),
        zero0_full("full-qwen0.5b-z0-s8192-mb2-lion", "qwen2.5-0.5b", 8192, 2, "lion"),
    ]),
    # full fine-tunes under ZeRO-0 with optimizers that are not FusedAdam (a checkpoint save without
    # a flat fp32 group), QLoRA under ZeRO-1 on Gemma 2 at 2 x 4096, and Llama 3.1 8B LoRA under
    # ZeRO-2 with the optimizer on the CPU
    "heldout15": (None, [
        zero0_full("full-llama1b-z0-s2048-mb4-sgd", "llama-3.2-1b", 2048, 4, "sgd"),
        zero0_full("full-qwen1.5b-z0-s1024-mb4-adamw8bit", "qwen2.5-1.5b", 1024, 4, "adamw_8bit"),
        job("qlora-gemma2-2b-z1-s4096-mb2", "gemma-2-2b", "qlora", ONE_GPU | {"zero_stage": 1}, seq_len=4096,
            micro=2, accumulation=1, checkpointing=True),
        job("lora-llama8b-z2-offopt-s2048-mb4", "llama-3.1-8b", "lora",
            ONE_GPU | {"zero_stage": 2, "offload_optimizer": "cpu"}, seq_len=2048, micro=4, accumulation=1,
            checkpointing=True),
    ]),
    # a second ZeRO-3 full fine-tune with both offloads (the first planned 3 GiB of cache it did not
    # hold), QLoRA with the optimizer on the CPU, LoRA at 16 x 512, Lion under ZeRO-1 and SGD under
    # ZeRO-0
    "heldout16": (None, [
        job("full-llama3b-z3-offload-s4096-mb2", "llama-3.2-3b", "full", FIELD_REPORT, seq_len=4096, micro=2,
            accumulation=1, checkpointing=True),
        job("qlora-mistral7b-z2-offopt-s2048-mb4", "mistral-7b-v0.3", "qlora",
            ONE_GPU | {"zero_stage": 2, "offload_optimizer": "cpu"}, seq_len=2048, micro=4, accumulation=1,
            checkpointing=True),
        job("lora-gemma2-2b-z0-s512-mb16", "gemma-2-2b", "lora", Z0, seq_len=512, micro=16, accumulation=1,
            checkpointing=True),
        job("full-qwen1.5b-z1-s1024-mb8-lion", "qwen2.5-1.5b", "full", ONE_GPU | {"zero_stage": 1},
            seq_len=1024, micro=8, accumulation=1, checkpointing=True, optimizer="lion"),
        # ZeRO-0 with an optimizer that is not FusedAdam, its peak at the optimizer step
        zero0_full("full-llama3b-z0-s512-mb4-sgd", "llama-3.2-3b", 512, 4, "sgd"),
    ]),
    # full fine-tunes under ZeRO-0 with optimizers other than FusedAdam, their peak at the step: the
    # loss's blocks partly placed in the cached gradient blocks of initialisation (Llama 3.2 1B at
    # 4 x 256), none (Qwen2.5-1.5B with 8-bit AdamW at 4 x 2048, Llama 3.2 3B with Lion at 2 x 1024),
    # and a soft-capped loss (Gemma 2 2B with SGD at 2 x 1024)
    "heldout17": (None, [
        zero0_full("full-llama1b-z0-s256-mb4-sgd", "llama-3.2-1b", 256, 4, "sgd"),
        zero0_full("full-qwen1.5b-z0-s2048-mb4-adamw8bit", "qwen2.5-1.5b", 2048, 4, "adamw_8bit"),
        zero0_full("full-llama3b-z0-s1024-mb2-lion", "llama-3.2-3b", 1024, 2, "lion"),
        zero0_full("full-gemma2-2b-z0-s1024-mb2-sgd", "gemma-2-2b", 1024, 2, "sgd"),
    ]),
    # the unfused step's loss blocks inside the lease and the allocator limit: heldout17's two jobs
    # that missed, again (Qwen2.5-1.5B had run at a limit without them), and three more (no block
    # unplaced: Phi-3 mini, whose untied head and embedding hold the loss; some: Llama 3.2 3B with
    # 8-bit AdamW; all: Qwen2.5-3B with Lion at 4 x 1024)
    "heldout18": (None, [
        zero0_full("full-qwen1.5b-z0-s2048-mb4-adamw8bit", "qwen2.5-1.5b", 2048, 4, "adamw_8bit"),
        zero0_full("full-llama1b-z0-s256-mb4-sgd", "llama-3.2-1b", 256, 4, "sgd"),
        zero0_full("full-phi3-z0-s512-mb2-sgd", "phi-3-mini", 512, 2, "sgd"),
        zero0_full("full-llama3b-z0-s2048-mb1-adamw8bit", "llama-3.2-3b", 2048, 1, "adamw_8bit"),
        zero0_full("full-qwen3b-z0-s1024-mb4-lion", "qwen2.5-3b", 1024, 4, "lion"),
    ]),
    # held out for the checkpointed forward's free segments (CHECKPOINT_SEGMENTS): LoRA and QLoRA with
    # checkpointing at 8,192-16,384 tokens a micro-batch on shapes whose MLP holds two to five
    # checkpoints a block, a ZeRO-1 and a ZeRO-2 among them, and Gemma 2 under its eager attention
    "heldout19": (None, [
        job("qlora-llama3b-z1-s2048-mb6", "llama-3.2-3b", "qlora", ONE_GPU | {"zero_stage": 1}, seq_len=2048,
            micro=6, accumulation=1, checkpointing=True),
        job("lora-qwen3b-z0-s2048-mb8-all", "qwen2.5-3b", "lora", Z0, seq_len=2048, micro=8, accumulation=1,
            checkpointing=True, targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                         "down_proj"]),
        job("lora-llama1b-z2-s2048-mb8", "llama-3.2-1b", "lora", ONE_GPU | {"zero_stage": 2}, seq_len=2048,
            micro=8, accumulation=1, checkpointing=True),
        job("qlora-qwen1.5b-z0-s1024-mb16", "qwen2.5-1.5b", "qlora", Z0, seq_len=1024, micro=16,
            accumulation=1, checkpointing=True),
        job("lora-gemma2-2b-z0-s2048-mb4", "gemma-2-2b", "lora", Z0, seq_len=2048, micro=4, accumulation=1,
            checkpointing=True),
    ]),
    # held out for ZeRO-3's reduction stream with the optimizer on the CPU (ZERO3_REDUCTION_STREAM):
    # full fine-tunes on one GPU whose buckets differ from the traced ones (Gemma 2 2B's embedding,
    # larger than a bucket, reduced alone; Phi-3 mini's untied head and fused projections; Qwen2.5-3B
    # and -0.5B, the second with its parameters on the card), and LoRA on Llama 3.1 8B, whose adapters'
    # gradients fill one bucket
    "heldout20": (None, [
        job("full-gemma2-2b-z3-offopt-s2048-mb2", "gemma-2-2b", "full", Z3_OFFOPT, seq_len=2048, micro=2,
            accumulation=1, checkpointing=True),
        job("full-qwen3b-z3-offload-s2048-mb2", "qwen2.5-3b", "full", FIELD_REPORT, seq_len=2048, micro=2,
            accumulation=1, checkpointing=True),
        job("full-qwen0.5b-z3-offopt-s4096-mb4", "qwen2.5-0.5b", "full", Z3_OFFOPT, seq_len=4096, micro=4,
            accumulation=1, checkpointing=True),
        job("full-phi3-z3-offopt-s1024-mb2", "phi-3-mini", "full", Z3_OFFOPT, seq_len=1024, micro=2,
            accumulation=1, checkpointing=True),
        job("lora-llama8b-z3-offopt-s2048-mb2", "llama-3.1-8b", "lora", Z3_OFFOPT, seq_len=2048, micro=2,
            accumulation=1, checkpointing=True),
    ]),
    # held out for ZeRO-1/2's initialisation cache and reduction stream with the optimizer on the CPU
    # (ZERO12_INITIALIZATION_CACHE), defined before it ran
    "heldout21": (None, [
        job("full-llama1b-z2-offopt-s1024-mb4", "llama-3.2-1b", "full", OFFOPT_Z2, seq_len=1024, micro=4,
            accumulation=1, checkpointing=True),
        job("full-gemma2-2b-z2-offopt-s1024-mb2", "gemma-2-2b", "full", OFFOPT_Z2, seq_len=1024, micro=2,
            accumulation=1, checkpointing=True),
        job("full-llama3b-z1-offopt-s4096-mb1-acc2", "llama-3.2-3b", "full", ONE_GPU | {"zero_stage": 1,
            "offload_optimizer": "cpu"}, seq_len=4096, micro=1, accumulation=2, checkpointing=True),
        job("full-qwen1.5b-z2-offopt-s1024-mb2-nockpt", "qwen2.5-1.5b", "full", OFFOPT_Z2, seq_len=1024,
            micro=2, accumulation=1, checkpointing=False),
    ]),
    # two of heldout10's ZeRO-3 jobs again, as defined there: their step times run to run on one box
    "heldout10-z3-again": (None, [
        job("full-qwen0.5b-z3-s4096-mb4", "qwen2.5-0.5b", "full", ONE_GPU | {"zero_stage": 3}, seq_len=4096,
            micro=4, accumulation=1, checkpointing=True),
        job("lora-qwen3-4b-z3-s2048-mb4", "qwen3-4b", "lora", ONE_GPU | {"zero_stage": 3}, seq_len=2048,
            micro=4, accumulation=1, checkpointing=True),
    ]),
    # the loss in chunks against the full logits, the same 8B job otherwise (what a chunk costs a step)
    "chunk": (None, [
        job(f"lora-llama8b-z0-s2048-mb2-{name}", "llama-3.1-8b", "lora", Z0, seq_len=2048, micro=2,
            accumulation=1, checkpointing=True, chunk=chunk)
        for name, chunk in (("full", None), ("c1024", 1024))]),
    # every resource "auto" under a 24 GiB card, the loss's chunk "auto" and the full logits
    "chunk24": (24, [job(f"lora-llama8b-auto-24g-{name}", "llama-3.1-8b", "lora", AUTO, seq_len=2048,
                         accumulation=2, chunk=chunk)
                     for name, chunk in (("chunk", "auto"), ("full", None))]),
}
#: phases whose jobs shared one card: their step time is not a job's alone
SHARED_PHASES = {"pack", "pack7b"}
#: phases whose jobs run one at a time (their hosts' memory together would not fit the box)
SEQUENTIAL = {"offload1", "heldout2", "heldout3", "ranked10", "ranked24", "ranked40", "qlora-steps",
              "qlora-steps-heldout", "heldout4", "chunk", "chunk24", "current", "heldout5", "heldout6",
              "heldout7", "heldout8", "heldout9", "heldout10", "heldout10-z3-again", "heldout11",
              "heldout11-alone", "heldout12", "heldout13", "heldout14", "heldout15",
              "heldout16", "heldout17", "heldout18", "heldout19", "heldout20", "heldout21"}


def record_spec(spec: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The submitted job as a spec that plans anywhere: the model by its config, no dataset."""
    from bench.cases import MODELS

    return {**{k: v for k, v in body.items() if k not in ("model", "dataset", "name")},
            "model": {"config": dict(MODELS[spec["model"]])}}


PINNED = ("num_gpus", "zero_stage", "offload_optimizer", "offload_param")


def boxes(report: dict[str, Any], phase: dict[str, Any]) -> dict[str, Any]:
    """The box a phase's jobs ran on, as a plan's ``hardware``."""
    hw = report["hardware"]
    return {"gpu_count": 1, "host_memory_bytes": hw["host_memory_gib"] * GIB,
            "gpu_memory_bytes": phase["card_limit_bytes"] or hw["gpu_memory_bytes"]}


def model_folder(config: dict[str, Any], where: Path) -> Path:
    """A folder as the job had it: the config and a (sparse) bf16 weight file of the model's size,
    which the plan's host figure reads (the checkpoint is loaded through host memory)."""
    from planner import plan

    folder = where / f"{config['model_type']}-{config['hidden_size']}-{config['num_hidden_layers']}"
    if not folder.exists():
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(config))
        parameters = plan({"model": {"config": config}, "method": "full", "hardware": {
            "gpu_count": 1, "gpu_memory_bytes": 2**40, "host_memory_bytes": 2**40}}).model.num_parameters
        with (folder / "model.safetensors").open("wb") as fh:
            fh.truncate(2 * parameters)
    return folder


#: the rows ``main`` builds (``build_dataset``): 400 alpaca rows of 2529 tokens each (2533 at most)
#: with the bench's tokenizer, as the trainer counted them in every report's job logs
DATASET_ROWS, DATASET_ROW_TOKENS = 400, 2529


def dataset_counts(job: dict[str, Any], seq_len: int) -> dict[str, int]:
    """The job's training rows and their tokens after truncation to ``seq_len``: as its trainer
    counted them, or (reports from before the count was kept) as the bench builds them."""
    data = job.get("data") or {}
    if data.get("rows") and data.get("tokens"):
        return {"num_rows": int(data["rows"]), "num_tokens": int(data["tokens"])}
    return {"num_rows": DATASET_ROWS, "num_tokens": DATASET_ROWS * min(DATASET_ROW_TOKENS, seq_len)}


def replan(job: dict[str, Any], box: dict[str, Any], where: Path) -> Any:
    """The job planned by today's planner with the configuration it ran, on the box it ran on, for
    the rows it trained on (whether they needed an attention mask)."""
    from planner import plan

    return plan(replan_spec(job, box, where))


def replan_spec(job: dict[str, Any], box: dict[str, Any], where: Path) -> dict[str, Any]:
    """The spec ``replan`` plans: the job's configuration pinned, its box, rows and attention."""
    from planner.dsconfig import ZERO_KNOBS

    resolved = job["plan"]["resolved"]
    spec = dict(job["spec"])
    spec["model"] = {"path": str(model_folder(spec["model"]["config"], where))}
    zero = (job["plan"].get("deepspeed_config") or {}).get("zero_optimization") or {}
    knobs = {k: v for k, v in zero.items() if k in ZERO_KNOBS}  # as the job ran them, not as chosen today
    spec["resources"] = {**spec["resources"], **{k: resolved[k] for k in PINNED}, "deepspeed": knobs}
    spec["training"] = {**spec["training"], "micro_batch_size": resolved["micro_batch_size"],
                        "gradient_accumulation_steps": resolved["gradient_accumulation_steps"],
                        "gradient_checkpointing": resolved["gradient_checkpointing"]}
    spec["hardware"] = box
    spec["dataset"] = {"path": "rows.jsonl", "format": "alpaca", "eval_fraction": 0.0,
                       **dataset_counts(job, resolved["seq_len"])}
    # the attention the model ran: as the trainer reported it, else transformers' pick when the
    # trainer left it to transformers, which was SDPA for every family in 5.17 (every earlier report)
    spec["training"]["attn_implementation"] = (spec["training"].get("attn_implementation")
                                               or job.get("attn_implementation") or "sdpa")
    return spec


def measured_step_seconds(job: dict[str, Any]) -> float | None:
    """The trainer's median step time after warm-up; in reports from before that field, a step of
    full rows at the median real tokens/s (which understates a step whose rows are part empty)."""
    if job.get("steady_step_seconds"):
        return float(job["steady_step_seconds"])
    if not job.get("steady_tokens_per_second"):
        return None
    r = job["plan"]["resolved"]
    tokens = r["micro_batch_size"] * r["gradient_accumulation_steps"] * r["seq_len"]
    return float(tokens / job["steady_tokens_per_second"])


def record_names(ident: str) -> set[str]:
    """How ``planner/data/calibration.json`` names a job (``file:phase:job``) as evidence: its report,
    or the job itself in it (paths under bench/results)."""
    file, _, rest = ident.partition(":")
    return {f"field-cases/{file}.json", f"field-cases/{file}.json:{rest}"}


def measured_jobs(paths: list[Path]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(file:phase:job, job record, box) of every job that ran at least two steps."""
    out = []
    for path in sorted(paths):
        report = json.loads(path.read_text())
        for phase_name, phase in report["phases"].items():
            for name, job in phase["jobs"].items():
                if job.get("nvml_peak_bytes") and job.get("steps", 0) >= 2:
                    out.append((f"{path.stem}:{phase_name}:{name}", job, boxes(report, phase)))
    return out


def render(paths: list[Path], where: Path) -> str:
    """The markdown report of the records: planned at submission, planned today, measured."""
    lines = ["| job | card | configuration | status (steps) | planned at submission GiB | planned now GiB | "
             "NVML peak GiB | error now | torch reserved / allocated GiB | host planned now / measured GiB "
             "| step s planned now / measured |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for ident, job, box in measured_jobs(paths):
        now = replan(job, box, where)
        r = job["plan"]["resolved"]
        setup = (f"{r['method']} z{r['zero_stage']} off={r['offload_optimizer']}/{r['offload_param']} "
                 f"mb{r['micro_batch_size']}x{r['gradient_accumulation_steps']} s{r['seq_len']}")
        nvml = job["nvml_peak_bytes"]
        host = job.get("measured_host_rss_bytes")
        step = measured_step_seconds(job)
        planned_now = now.per_gpu.total_bytes
        reserved, allocated = job["torch_reserved_peak_bytes"], job["torch_allocated_peak_bytes"]
        cells = [ident, f"{box['gpu_memory_bytes'] / GIB:.0f} GiB", setup,
                 f"{job['status']} ({job['steps']})", f"{job['planned_peak_gpu_bytes'] / GIB:.2f}",
                 f"{planned_now / GIB:.2f}", f"{nvml / GIB:.2f}", f"{(planned_now - nvml) / nvml:+.1%}",
                 f"{reserved / GIB:.2f} / {allocated / GIB:.2f}",
                 f"{now.host.total_bytes / GIB:.2f} / {(host or 0) / GIB:.2f}",
                 f"{now.estimated_step_seconds:.3f} / " + (f"{step:.3f}" if step else "-")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plan_summary(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    if not plan:
        return None
    per_gpu = plan.get("per_gpu") or {}
    keys = ("total_bytes", "required_bytes", "allocator_limit_bytes", "allocator_slack_bytes",
            "cuda_context_bytes", "peak_phase", "capacity_bytes")
    return {"fits": plan.get("fits"), "resolved": plan.get("resolved"),
            "per_gpu": {k: per_gpu.get(k) for k in keys},
            "host_total_bytes": (plan.get("host") or {}).get("total_bytes"),
            "estimated_step_seconds": plan.get("estimated_step_seconds"),
            "estimated_tokens_per_second": plan.get("estimated_tokens_per_second"),
            # the box's factors the step was planned with (its host-clock probe, its learned ratio)
            "host_clock_factor": plan.get("host_clock_factor"),
            "step_time_factor": plan.get("step_time_factor"),
            "replanned_after_oom": plan.get("replanned_after_oom"),
            "deepspeed_config": plan.get("deepspeed_config")}


def _max(lines: list[dict[str, Any]], key: str) -> int | None:
    values = [int(ln[key]) for ln in lines if ln.get(key) is not None]
    return max(values) if values else None


def _result(client: httpx.Client, jid: str, data_dir: Path) -> dict[str, Any]:
    job_row = client.get(f"/v1/jobs/{jid}").json()
    events = client.get(f"/v1/jobs/{jid}/events", params={"limit": 1000}).json()["items"]
    lines = progress_lines(data_dir / "jobs" / jid)
    progress = [ln for ln in lines if ln.get("type") == "progress"]
    return {
        "id": jid, "status": job_row["status"], "attempt": job_row["attempt"], "failure": job_row["failure"],
        "plan": _plan_summary(job_row["plan"]),
        "planned_peak_gpu_bytes": job_row["planned_peak_gpu_bytes"],
        "measured_peak_gpu_bytes": job_row["progress"]["measured_peak_gpu_bytes"],
        "measured_host_rss_bytes": job_row["progress"]["measured_host_rss_bytes"],
        "nvml_peak_bytes": _max(progress, "nvml_peak_bytes"),
        "torch_reserved_peak_bytes": _max(progress, "peak_gpu_bytes"),
        "torch_allocated_peak_bytes": _max(progress, "peak_allocated_gpu_bytes"),
        "host_rss_peak_bytes": _max(progress, "host_rss_bytes"),
        "steady_tokens_per_second": steady_tokens_per_second(progress, skip=2),
        "steady_step_seconds": steady_step_seconds(progress, skip=2),
        "steps": len(progress),
        # the training rows as the trainer counted them (rows, tokens after truncation to seq_len)
        # and the attention the model ran
        "data": next((ln.get("data") for ln in lines if ln.get("type") == "start"), None),
        "attn_implementation": next((ln.get("attn_implementation") for ln in lines
                                     if ln.get("type") == "start"), None),
        "status_history": [(e["created_at"], e["data"]["to"], e["message"])
                           for e in events if e["kind"] == "status"],
        "gpus": job_row["gpu_indices"],
    }


def job_body(spec: dict[str, Any], steps: int) -> dict[str, Any]:
    """A phase's job as the bench submits it, less its model folder and dataset."""
    body = {**spec, "eval": {"when": "none"}}
    body["training"] = {**spec["training"], "max_steps": steps, "epochs": None, "save_steps": 10_000,
                        "precision": "bf16", "learning_rate": 2e-4 if spec["method"] != "full" else 2e-5}
    return body


def _serve(name: str, data_dir: Path, work: Path, env_extra: dict[str, str]
           ) -> tuple[subprocess.Popen[bytes], httpx.Client]:
    """``tunebox serve`` on its embedded default over ``data_dir``, and an admin's client of it."""
    env = dict(os.environ)
    env.update({"TUNEBOX_DATA_DIR": str(data_dir), "TUNEBOX_PROGRESS_INTERVAL_S": "1",
                "PYTHONPATH": f"{REPO}:{env.get('PYTHONPATH', '')}", **env_extra})
    for key in ("TUNEBOX_BROKER_URL", "TUNEBOX_DATABASE_URL"):
        env.pop(key, None)
    tunebox(env, "db", "upgrade")
    token = tunebox(env, "token", "create", "bench", "--admin").strip().splitlines()[0]
    port = free_port()
    log = (work / f"serve-{name}.log").open("wb")
    serve = subprocess.Popen([sys.executable, "-m", "tunebox.cli", "serve", "--port", str(port)], env=env,
                             cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                          headers={"Authorization": f"Bearer {token}"})
    return serve, client


def phase_jobs(name: str,
               only: Collection[str] | None = None) -> tuple[float | None, list[dict[str, Any]]]:
    """A phase's card limit and its jobs, or those of them named in ``only`` (each must be one)."""
    limit_gib, jobs = PHASES[name]
    if only is None:
        return limit_gib, jobs
    unknown = set(only) - {j["name"] for j in jobs}
    if unknown:
        raise SystemExit(f"phase {name} has no job {', '.join(sorted(unknown))}")
    return limit_gib, [j for j in jobs if j["name"] in only]


def run_phase(name: str, models: dict[str, Path], data: Path, work: Path, steps: int,
              timeout: float, wait_probe: float = 0.0,
              save: Callable[[dict[str, Any]], None] | None = None,
              only: Collection[str] | None = None) -> dict[str, Any]:
    """Run a phase's jobs (those named in ``only``, if given) through a fresh service; ``save`` gets
    the phase's record as soon as its jobs' results are in, before the service stops (a bench cut off
    while it stops keeps them)."""
    limit_gib, jobs = phase_jobs(name, only)
    data_dir = work / f"tunebox-{name}"
    env = {"TUNEBOX_MODEL_ROOTS": json.dumps(sorted({str(p.parent) for p in models.values()})),
           "TUNEBOX_DATASET_ROOTS": json.dumps([str(data.parent)]),
           "TUNEBOX_WORKER_CONCURRENCY": "1" if name in SEQUENTIAL else "0"}
    if limit_gib is not None:
        env["TUNEBOX_GPU_MEMORY_LIMIT_BYTES"] = str(int(limit_gib * GIB))
    serve, client = _serve(name, data_dir, work, env)
    out: dict[str, Any] = {"card_limit_bytes": int(limit_gib * GIB) if limit_gib else None, "jobs": {}}
    started = time.monotonic()
    try:
        wait_ready(client, serve, 120, work / f"serve-{name}.log")
        out["probe_wait_seconds"] = wait_for_probe(client, wait_probe)
        out["gpus"] = client.get("/v1/gpus").json()
        ids: dict[str, str] = {}
        for spec in jobs:
            spec = dict(spec)
            alternative = spec.pop("alternative", 0)
            body = {**job_body(spec, steps), "model": {"path": str(models[spec["model"]])},
                    "dataset": {"path": str(data), "format": "alpaca", "eval_fraction": 0.0}}
            if alternative:
                auto = client.post("/v1/plans", json={k: v for k, v in body.items() if k != "dataset"}).json()
                body = pin_alternative(body, auto, alternative)
                spec = {**spec, "resources": body["resources"], "training": {
                    **spec["training"], **{f: body["training"][f] for f in (
                        "micro_batch_size", "gradient_accumulation_steps", "gradient_checkpointing")}}}
            resp = client.post("/v1/jobs", json=body)
            entry: dict[str, Any] = {"submit_status": resp.status_code, "spec": record_spec(spec, body)}
            if resp.status_code == 201:
                ids[spec["name"]] = resp.json()["id"]
            else:
                entry["refusal"] = resp.json()
                plan = client.post("/v1/plans", json={k: v for k, v in body.items() if k != "dataset"})
                entry["plan"] = plan.json() if plan.status_code == 200 else plan.text[:4000]
            out["jobs"][spec["name"]] = entry
        deadline = time.monotonic() + timeout
        while ids and time.monotonic() < deadline:
            states = {n: client.get(f"/v1/jobs/{i}").json()["status"] for n, i in ids.items()}
            for n, state in states.items():  # the disk holds the models, not every job's checkpoints
                if state in TERMINAL:
                    shutil.rmtree(data_dir / "jobs" / ids[n] / "checkpoints", ignore_errors=True)
            if all(s in TERMINAL for s in states.values()):
                break
            time.sleep(3)
        for n, jid in ids.items():
            out["jobs"][n].update(_result(client, jid, data_dir))
        out["seconds"] = round(time.monotonic() - started, 1)
        if save is not None:
            save(out)
    finally:
        out["seconds"] = round(time.monotonic() - started, 1)
        stop_serve(serve)
    return out


def recover_phase(name: str, archive: Path, steps: int, work: Path) -> dict[str, Any]:
    """The record of a phase whose bench was cut off after its jobs ran, rebuilt from the phase's
    archived service folder (``tunebox-PHASE`` of ``--work``): a copy of it is served again (no
    GPU needed) and each of the phase's jobs is read as ``run_phase`` reads it. A job submitted
    with an alternative keeps its phase's spec here; how it ran is in the plan stored with it,
    which is what ``replan`` reads."""
    limit_gib, jobs = PHASES[name]
    data_dir = work / f"tunebox-{name}"
    shutil.copytree(archive, data_dir)
    # its worker runs no job: it builds no DeepSpeed op and probes no host clock
    quiet = {"TUNEBOX_WORKER_CONCURRENCY": "0", "TUNEBOX_PREBUILD_OPS": "[]", "TUNEBOX_HOST_PROBE": "false"}
    serve, client = _serve(name, data_dir, work, quiet)
    out: dict[str, Any] = {"card_limit_bytes": int(limit_gib * GIB) if limit_gib else None, "jobs": {},
                           "recovered_from_archive": True}
    try:
        wait_ready(client, serve, 120, work / f"serve-{name}.log")
        stored = {j["name"]: j["id"] for j in client.get("/v1/jobs", params={"limit": 200}).json()["items"]}
        for spec in jobs:
            spec = {k: v for k, v in spec.items() if k != "alternative"}
            if spec["name"] not in stored:
                continue
            record = record_spec(spec, job_body(spec, steps))
            out["jobs"][spec["name"]] = {"submit_status": 201, "spec": record,
                                         **_result(client, stored[spec["name"]], data_dir)}
    finally:
        stop_serve(serve)
    return out


def archive_hardware(archive: Path, same_image_as: Path) -> dict[str, Any]:
    """``box_hardware`` of an archived phase: the card, driver, torch and DeepSpeed as its worker's
    probe stored them; the host and the other libraries from a report of the same image."""
    import sqlite3

    with sqlite3.connect(archive / "tunebox.db") as db:
        name, memory = db.execute("SELECT name, memory_total_bytes FROM gpus ORDER BY id LIMIT 1").fetchone()
        count = db.execute("SELECT count(*) FROM gpus").fetchone()[0]
        identity, figures, when = db.execute(
            "SELECT identity, figures, created_at FROM box_probes ORDER BY id DESC LIMIT 1").fetchone()
    identity, figures = json.loads(identity), json.loads(figures)
    image = json.loads(same_image_as.read_text())["hardware"]
    return {**image, "gpu_name": name, "gpu_memory_bytes": int(memory), "gpu_count": int(count),
            "cpu_count": figures.get("host_cpu_count", image.get("cpu_count")),
            "driver": identity["driver"], "torch": identity["torch"], "deepspeed": identity["deepspeed"],
            "date": str(when)[:10], "host_and_libraries_from": same_image_as.name}


def wait_for_probe(client: httpx.Client, seconds: float) -> float | None:
    """Until the worker's start-up probe of this box is stored (ok or failed), so that the phase's
    first job is planned with the probed figures; the seconds waited, None if it never came."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if client.get("/v1/gpus").json().get("boxes"):
            return round(time.monotonic() - started, 1)
        time.sleep(2)
    return None if seconds > 0 else 0.0


def box_hardware() -> dict[str, Any]:
    """The GPU, host and library versions a report's jobs ran on."""
    import importlib.metadata as md
    import platform

    import psutil
    import pynvml

    pynvml.nvmlInit()
    card = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = pynvml.nvmlDeviceGetName(card)
    out: dict[str, Any] = {
        "gpu_name": name.decode() if isinstance(name, bytes) else name,
        "gpu_memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(card).total),
        "gpu_count": int(pynvml.nvmlDeviceGetCount()), "cpu_count": os.cpu_count(),
        "host_memory_gib": round(psutil.virtual_memory().total / GIB),
        "driver": pynvml.nvmlSystemGetDriverVersion(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d")}
    for package in ("torch", "transformers", "peft", "deepspeed", "bitsandbytes"):
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            out[package] = None
    return out


def add_step_seconds(report_path: Path, logs: Path) -> int:
    """Write each job's ``steady_step_seconds`` into a report from its job folders' progress files in
    ``logs`` (the phase's archive of ``--work``); returns how many jobs got one."""
    report = json.loads(report_path.read_text())
    progress = archived_progress(logs)
    found = 0
    for phase in report["phases"].values():
        for job in phase["jobs"].values():
            lines = progress.get(str(job.get("id")))
            if lines is None:
                continue
            job["steady_step_seconds"] = steady_step_seconds(lines, skip=2)
            found += job["steady_step_seconds"] is not None
    report_path.write_text(json.dumps(report, indent=1, default=str))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--phase", action="append", choices=sorted(PHASES))
    ap.add_argument("--work", type=Path, default=Path("/tmp/tunebox-field-cases"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300, help="seconds a phase waits for its jobs")
    ap.add_argument("--wait-probe", type=float, default=0.0, metavar="SECONDS",
                    help="before a phase's first job, wait up to this long for the box probe of its worker")
    ap.add_argument("--only", action="append", metavar="JOB",
                    help="run only these of the phases' jobs (repeat it; the report says which ran)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--render", type=Path, nargs="+", metavar="REPORT",
                    help="print the markdown table of these reports against today's planner")
    ap.add_argument("--add-step-seconds", type=Path, nargs=2, metavar=("REPORT", "LOGS"),
                    help="add each job's steady_step_seconds to REPORT from the progress files in LOGS")
    ap.add_argument("--recover", type=Path, metavar="SERVICE_FOLDER",
                    help="write --out for the one --phase from its archived service folder (tunebox-PHASE), "
                         "for a bench cut off after the phase's jobs ran")
    ap.add_argument("--same-image-as", type=Path, metavar="REPORT",
                    help="with --recover: an earlier report of the same GPU image, for the host and library "
                         "versions the service folder does not store")
    args = ap.parse_args()
    if args.add_step_seconds:
        print(add_step_seconds(*args.add_step_seconds), "jobs")
        return 0
    if args.render:
        import tempfile

        with tempfile.TemporaryDirectory() as where:
            print(render(args.render, Path(where)), end="")
        return 0
    if args.list:
        for name, (limit, jobs) in PHASES.items():
            print(name, f"card limit {limit} GiB" if limit else "whole card", [j["name"] for j in jobs])
        return 0
    if not args.out or not args.phase:
        ap.error("--out and at least one --phase are needed")
    if args.recover:
        if len(args.phase) != 1 or not args.same_image_as:
            ap.error("--recover needs one --phase and --same-image-as")
        import tempfile

        with tempfile.TemporaryDirectory() as where:
            phase = recover_phase(args.phase[0], args.recover, args.steps, Path(where))
        args.out.write_text(json.dumps({"hardware": archive_hardware(args.recover, args.same_image_as),
                                        "steps": args.steps, "phases": {args.phase[0]: phase}},
                                       indent=1, default=str))
        return 0
    t0 = time.monotonic()
    wanted = {j["model"] for p in args.phase for j in phase_jobs(p, args.only)[1]}
    models = {m: build_model(m, args.work / "models" / m, "cuda") for m in sorted(wanted)}
    data = build_dataset(args.work / "data" / "pattern.jsonl", rows=DATASET_ROWS, words=2500)
    report: dict[str, Any] = {"hardware": box_hardware(), "setup_seconds": round(time.monotonic() - t0, 1),
                              "steps": args.steps, "phases": {}}
    def save(name: str, phase: dict[str, Any]) -> None:  # kept if the bench is cut off later
        report["phases"][name] = phase
        args.out.write_text(json.dumps(report, indent=1, default=str))

    for phase in args.phase:
        save(phase, run_phase(phase, models, data, args.work, args.steps, args.timeout, args.wait_probe,
                              save=lambda out, name=phase: save(name, out), only=args.only))
        for n, r in report["phases"][phase]["jobs"].items():
            print(phase, n, r.get("status") or r.get("submit_status"), "planned",
                  r.get("planned_peak_gpu_bytes"), "nvml", r.get("nvml_peak_bytes"), "reserved",
                  r.get("torch_reserved_peak_bytes"), "alloc", r.get("torch_allocated_peak_bytes"),
                  "tok/s", r.get("steady_tokens_per_second"), "attempt", r.get("attempt"), flush=True)
    report["total_seconds"] = round(time.monotonic() - t0, 1)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
