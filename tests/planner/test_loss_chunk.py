"""``training.loss_chunk_tokens: "auto"``: the search computes the loss in chunks only where that is
what makes a faster configuration fit, and charges the chunks' recomputed LM head in the step."""

from __future__ import annotations

from typing import Any

from planner import plan
from planner.search import LOSS_CHUNK_TOKENS
from tests.planner.support import GIB, hardware, job

#: Llama 3's 128,256-token vocabulary at 2 x 2048 positions: the full logits are about 5 GiB
_8B = {"model": {"name": "meta-llama/Llama-3.1-8B"}, "method": "lora"}
_TRAINING = {"micro_batch_size": 2, "gradient_accumulation_steps": 4, "seq_len": 2048,
             "gradient_checkpointing": True}
_RESOURCES = {"num_gpus": 1, "zero_stage": 0, "offload_optimizer": "none", "offload_param": "none"}
_SAFETY = 0.03  # GPU_SAFETY_FRACTION: a fit leaves this share of the card free


def _spec(chunk: Any, gpu_bytes: int | None = None, **training: Any) -> dict[str, Any]:
    hw = hardware() if gpu_bytes is None else hardware(gpu_bytes=gpu_bytes)
    return job(**_8B, training={**_TRAINING, **training, "loss_chunk_tokens": chunk},
               resources=_RESOURCES, hardware=hw)


def _card_between() -> int:
    """A card on which the job fits with the loss in chunks and not with its full logits."""
    full = plan(_spec(None)).per_gpu.required_bytes
    chunked = plan(_spec(LOSS_CHUNK_TOKENS)).per_gpu.required_bytes
    assert full - chunked > 3 * GIB
    return int((full + chunked) / 2 / (1 - _SAFETY))


def test_auto_chunks_the_loss_where_the_full_logits_do_not_fit() -> None:
    card = _card_between()
    auto = plan(_spec("auto", card))
    assert auto.fits
    assert auto.resolved.loss_chunk_tokens == LOSS_CHUNK_TOKENS
    assert auto.per_gpu.logits_bytes == plan(_spec(LOSS_CHUNK_TOKENS)).per_gpu.logits_bytes
    assert not plan(_spec(None, card)).fits


def test_auto_keeps_the_full_logits_where_they_fit() -> None:
    auto, full = plan(_spec("auto")), plan(_spec(None))
    assert auto.resolved.loss_chunk_tokens is None
    assert auto.estimated_step_seconds == full.estimated_step_seconds
    assert auto.per_gpu.total_bytes == full.per_gpu.total_bytes


def test_a_refusal_proposes_the_chunked_loss_as_its_smallest_change() -> None:
    refused = plan(_spec(None, _card_between()))
    assert not refused.fits
    changes = [a.changes for a in refused.alternatives if a.fits]
    assert {"training.loss_chunk_tokens": LOSS_CHUNK_TOKENS} in changes


def test_the_chunked_loss_costs_the_lm_heads_forward_once_more() -> None:
    # a micro-batch of one chunk: the memory is the same, the step is one head forward longer
    full, chunked = plan(_spec(None, micro_batch_size=1, seq_len=1024)), plan(_spec(1024, micro_batch_size=1,
                                                                                     seq_len=1024))
    assert chunked.per_gpu.logits_bytes == full.per_gpu.logits_bytes
    assert chunked.estimated_step_seconds > full.estimated_step_seconds
    # the search never pays that where the chunk holds the whole micro-batch
    assert plan(_spec("auto", micro_batch_size=1, seq_len=1024)).resolved.loss_chunk_tokens is None

