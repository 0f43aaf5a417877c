"""A search scores many points of one micro-step shape, so the step-time model memoises the terms
that depend on the shape alone. Those memoised terms must equal the terms computed from the whole
setup, whatever its other fields: a term that starts reading another field fails here."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from typing import Any

import pytest

from bench.accuracy import record_setup
from planner.enums import OffloadDevice, Optimizer, Precision
from planner.setup import Setup, ZeroKnobs
from planner.speed import (
    _bytes_per_element,
    _gpu_seconds,
    _masked_attention_seconds,
    _micro_gpu,
    adapter_bytes,
    memory_bound_elements,
)
from tests.planner.support import job

FIELDS: dict[str, list[Any]] = {
    "num_gpus": [1, 2, 8],
    "zero_stage": [0, 1, 2, 3],
    "offload_optimizer": list(OffloadDevice),
    "offload_param": list(OffloadDevice),
    "micro_batch_size": [1, 4],
    "gradient_accumulation_steps": [1, 4],
    "seq_len": [512, 4096],
    "gradient_checkpointing": [False, True],
    "precision": [Precision.BF16, Precision.FP32],
    "optimizer": list(Optimizer),
    "attn_implementation": ["sdpa", "eager"],
    "knobs": [ZeroKnobs(), ZeroKnobs(param_persistence_threshold=0, overlap_comm=False)],
    "loss_chunk_tokens": [None, 1024],
    "attention_mask": [False, True],
}


def _setups(base: Setup, n: int) -> list[Setup]:
    rng = random.Random(0)
    return [replace(base, **{k: rng.choice(v) for k, v in FIELDS.items()}) for _ in range(n)]


@pytest.mark.parametrize(("model", "method"), list(itertools.product(
    ["Qwen/Qwen2.5-1.5B", "google/gemma-2-2b"], ["full", "lora", "qlora"])))
def test_memoised_micro_step_terms_equal_the_terms_of_the_whole_setup(model: str, method: str) -> None:
    resources = {"num_gpus": 1, "zero_stage": 0, "offload_optimizer": "none", "offload_param": "none"}
    spec = job(model={"name": model}, method=method, training={"micro_batch_size": 1, "seq_len": 512},
               resources=resources)
    p, base = record_setup(spec)
    for s in _setups(base, 200):
        gpu, flops = _gpu_seconds(p.facts, s, p.rates)
        direct = sum(_bytes_per_element(k) * n for k, n in memory_bound_elements(p.facts, s).items())
        assert _micro_gpu(p.facts, s, p.rates) == (gpu, flops, _masked_attention_seconds(p.facts, s, p.rates),
                                                   direct + adapter_bytes(p.facts, s))
