"""Packed training plans its steps from the dataset's tokens: a step is micro_batch x seq_len tokens a GPU."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from planner import plan
from tests.planner.support import job

TRAINING = {
    "micro_batch_size": 4,
    "gradient_accumulation_steps": 4,
    "seq_len": 1024,
    "gradient_checkpointing": False,
    "epochs": 2,
}


def _steps(packing: bool, **dataset: object) -> int | None:
    spec = job(
        training={**TRAINING, "packing": packing},
        dataset={"path": "/d.jsonl", "eval_fraction": 0.1, **dataset},
    )
    return plan(spec).estimated_steps


def test_packed_steps_come_from_the_tokens_and_unpacked_ones_from_the_rows() -> None:
    rows, tokens = 10_000, 1_500_000  # 150 tokens a row: about 6.8 rows in each 1024-token packed row
    packed = _steps(True, num_rows=rows, num_tokens=tokens)
    assert packed == math.ceil(math.ceil(tokens * 0.9 / 1024) / 16 * 2)
    unpacked = _steps(False, num_rows=rows, num_tokens=tokens)
    assert unpacked == math.ceil(9000 / 16 * 2)
    assert unpacked > 5 * packed
    # without token statistics the rows are all the planner has
    assert _steps(True, num_rows=rows) == unpacked
    assert _steps(True) is None


def test_the_rows_packing_made_set_the_steps_and_the_real_tokens_a_second() -> None:
    # 1,000 examples of 600 tokens in rows of 1024: packing keeps them whole, one a row
    rows, tokens, packed_rows = 1_000, 600_000, 1_000
    counted = plan(job(training={**TRAINING, "packing": True}, dataset={
        "path": "/d.jsonl", "eval_fraction": 0.1, "num_rows": rows, "num_tokens": tokens}))
    packed = plan(job(training={**TRAINING, "packing": True}, dataset={
        "path": "/d.jsonl", "eval_fraction": 0.1, "num_rows": rows, "num_tokens": tokens,
        "num_packed_rows": packed_rows}))
    assert packed.estimated_steps == math.ceil(900 / 16 * 2)
    assert counted.estimated_steps == math.ceil(math.ceil(tokens * 0.9 / 1024) / 16 * 2)
    assert counted.estimated_steps < packed.estimated_steps
    assert packed.estimated_step_seconds == counted.estimated_step_seconds  # the same full-length rows
    fill = tokens / (packed_rows * 1024)
    assert packed.estimated_tokens_per_second == pytest.approx(counted.estimated_tokens_per_second * fill,
                                                               rel=1e-6)
    assert packed.estimated_duration_seconds == pytest.approx(
        packed.estimated_steps * packed.estimated_step_seconds, abs=1e-3)


def test_alternatives_count_real_tokens_at_the_counted_seq_len_only() -> None:
    def alternatives(**counts: int) -> dict[str, Any]:
        spec = job(model={"name": "meta-llama/Llama-3.1-8B"},
                   training={**TRAINING, "packing": True, "micro_batch_size": "auto"},
                   resources={"num_gpus": 1, "zero_stage": "auto", "offload_optimizer": "auto",
                              "offload_param": "auto"},
                   dataset={"path": "/d.jsonl", "num_rows": 1_000, "num_tokens": 600_000, **counts})
        return {json.dumps(a.changes, sort_keys=True): a for a in plan(spec).alternatives}

    full, packed = alternatives(), alternatives(num_packed_rows=1_000)
    assert full.keys() == packed.keys() and full
    for key, alt in packed.items():
        assert alt.estimated_step_seconds == full[key].estimated_step_seconds
        assert f"planned {alt.estimated_tokens_per_second:,.0f} tokens/s" in alt.reason
        fill = 1.0 if "training.seq_len" in alt.changes else 600_000 / (1_000 * 1024)
        assert alt.estimated_tokens_per_second == pytest.approx(full[key].estimated_tokens_per_second * fill,
                                                                rel=1e-6)


def test_a_chunked_loss_plans_one_chunk_of_logits_not_the_micro_batchs() -> None:
    base = {
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "resources": {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "none", "offload_param": "none"},
    }
    training = {**TRAINING, "micro_batch_size": 2, "seq_len": 2048, "gradient_checkpointing": True}
    full = plan(job(**base, training=training))
    chunked = plan(job(**base, training={**training, "loss_chunk_tokens": 1024}))
    # Llama 3's 128,256-token vocabulary at 2 x 2048 positions: the logits term is four chunks' worth
    assert full.per_gpu.logits_bytes == 4 * chunked.per_gpu.logits_bytes
    assert full.per_gpu.logits_bytes > 4 * 2**30
    saved = full.per_gpu.total_bytes - chunked.per_gpu.total_bytes
    assert saved >= full.per_gpu.logits_bytes * 3 // 4
    assert chunked.deepspeed_config == full.deepspeed_config


def _masked_and_causal(checkpointing: bool) -> tuple[float, float]:
    """Step seconds of one 8B LoRA configuration with masked rows (no token counts: packed rows are
    planned as masked) and with rows that each fill seq_len (the counts show it)."""
    resources = {"num_gpus": 1, "zero_stage": 0, "offload_optimizer": "none", "offload_param": "none"}
    base = {"model": {"name": "meta-llama/Llama-3.1-8B"}, "method": "lora", "resources": resources}
    training = {**TRAINING, "micro_batch_size": 1, "gradient_accumulation_steps": 1, "seq_len": 8192,
                "gradient_checkpointing": checkpointing}
    masked = plan(job(**base, training=training, dataset={"path": "/d.jsonl", "num_rows": 100}))
    full_rows = plan(job(**base, training=training,
                         dataset={"path": "/d.jsonl", "num_rows": 100, "num_tokens": 100 * 8192}))
    return masked.estimated_step_seconds, full_rows.estimated_step_seconds


def test_masked_rows_are_timed_at_the_masked_kernels_measured_rate() -> None:
    """Llama 3.1 8B at 1 x 8192: the masked SDPA call takes its measured fixed cost plus three forwards'
    causal FLOPs at the measured fraction of the card's rate per layer, in place of the causal
    FLOPs at the matmuls' MFU; checkpointing adds the call's forward share once more."""
    from planner import constants as C

    layers, q_dim, seq = 32, 4096, 8192
    forward = 2.0 * seq * q_dim * seq
    call = C.MASKED_ATTENTION_CALL_SECONDS + 3 * forward / (C.MASKED_ATTENTION_RATE * C.DEFAULT_GPU_FLOPS)
    at_mfu = 3 * forward / (C.MFU * C.DEFAULT_GPU_FLOPS)
    masked, causal = _masked_and_causal(checkpointing=False)
    # the GPU bounds this step: the difference is the attention's, within what the host clock overlaps
    assert masked - causal == pytest.approx(layers * (call - at_mfu), rel=0.1)
    masked_ckpt, causal_ckpt = _masked_and_causal(checkpointing=True)
    recompute = C.MASKED_ATTENTION_FORWARD_SHARE * call - forward / (C.MFU * C.DEFAULT_GPU_FLOPS)
    assert (masked_ckpt - causal_ckpt) - (masked - causal) == pytest.approx(layers * recompute, rel=0.1)
