"""The memory-bound kernels' share of a step: counted per element, timed at the card's bandwidth."""

from __future__ import annotations

from typing import Any

import pytest

from bench.accuracy import record_setup
from planner import constants as C
from planner import plan
from planner.speed import ADAPTER_BACKWARD_BYTES, ADAPTER_FORWARD_BYTES, adapter_bytes, memory_bound_elements
from tests.planner.support import job


def _spec(model: str = "Qwen/Qwen2.5-1.5B", **training: Any) -> dict[str, Any]:
    return job(
        model={"name": model},
        method="lora",
        lora={"r": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        training={"micro_batch_size": 2, "gradient_accumulation_steps": 1, "seq_len": 2048,
                  "gradient_checkpointing": False, **training},
        resources={"num_gpus": 1, "zero_stage": 0, "offload_optimizer": "none", "offload_param": "none"},
    )


def _elements(spec: dict[str, Any]) -> dict[str, float]:
    p, s = record_setup(spec)
    return memory_bound_elements(p.facts, s)


def _adapter_bytes(spec: dict[str, Any]) -> float:
    p, s = record_setup(spec)
    return adapter_bytes(p.facts, s)


def test_checkpointing_runs_the_forward_kinds_twice_and_the_backward_ones_once() -> None:
    plain, ckpt = _elements(_spec()), _elements(_spec(gradient_checkpointing=True))
    for kind in ("layer_forward", "norm_forward"):
        assert ckpt[kind] == 2 * plain[kind] > 0
    for kind in ("layer_backward", "logits"):
        assert ckpt[kind] == plain[kind] > 0
    tokens, layers, hidden = 2 * 2048, 28, 1536
    assert plain["layer_backward"] == tokens * layers * hidden
    assert plain["logits"] == tokens * 151936
    assert plain["embedding_gradient"] == 0 and plain["scores_forward"] == 0


def test_adapters_are_counted_in_bytes_by_their_inputs_and_outputs() -> None:
    attention = _adapter_bytes(_spec())
    spec = _spec()
    spec["lora"]["target_modules"] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                      "down_proj"]
    everything = _adapter_bytes(spec)
    tokens, layers, hidden, inter = 2 * 2048, 28, 1536, 8960
    # gate and up read the hidden state and write the MLP's width; down the reverse
    mlp = ((hidden, inter), (hidden, inter), (inter, hidden))
    per_token = sum(ADAPTER_FORWARD_BYTES[0] * i + ADAPTER_FORWARD_BYTES[1] * o
                    + ADAPTER_BACKWARD_BYTES[0] * i + ADAPTER_BACKWARD_BYTES[1] * o for i, o in mlp)
    assert everything - attention == pytest.approx(tokens * layers * per_token)


def test_eager_attention_adds_scores_that_grow_with_the_sequence() -> None:
    gemma = "google/gemma-2-2b"
    short = _elements(_spec(gemma, seq_len=2048, micro_batch_size=2, attn_implementation="eager"))
    long = _elements(_spec(gemma, seq_len=4096, micro_batch_size=1, attn_implementation="eager"))
    assert short["scores_forward"] > 0 and long["scores_forward"] == 2 * short["scores_forward"]
    assert short["logit_softcap"] == short["logits"]  # Gemma 2 soft-caps its final logits
    full = _spec(gemma, attn_implementation="eager")
    full["method"] = "full"
    assert _elements(full)["embedding_gradient"] == 256000 * 2304


def test_a_card_with_less_bandwidth_plans_a_longer_step_by_the_memory_bound_share() -> None:
    def step(**hw: Any) -> float:
        spec = _spec()
        del spec["hardware"]["gpu_memory_bytes"]
        spec["hardware"].update(hw)
        return plan(spec).estimated_step_seconds

    h100 = step(gpu_name="NVIDIA H100 80GB HBM3")
    h200 = step(gpu_name="NVIDIA H200")
    # the two cards have the same tensor rate in the catalogue: only the bandwidth differs
    assert h100 > 1.05 * h200
    assert step(gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_bandwidth_gbps=4800.0) == pytest.approx(h200)
    assert C.MEMORY_BYTES_LOGITS > 0
