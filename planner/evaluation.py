"""Memory of the separate evaluation process: the trained model generating with a KV cache.

Worst case assumed: prompts as long as the training sequences, ``eval.batch_size`` of them, each
extended by ``eval.max_new_tokens``. Generation keeps logits of the last position only.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner import constants as C
from planner.memory import ModelFacts, weight_bytes

__all__ = ["EvalMemory", "estimate_eval"]


@dataclass(frozen=True, slots=True)
class EvalMemory:
    weights_bytes: int
    kv_cache_bytes: int
    activations_bytes: int
    logits_bytes: int
    cuda_context_bytes: int
    total_bytes: int
    prompt_tokens: int


def estimate_eval(
    facts: ModelFacts, precision: str, prompt_tokens: int, max_new_tokens: int, batch_size: int
) -> EvalMemory:
    arch = facts.arch
    act = weight_bytes(precision)
    weights = sum(t.numel * t.elem_bytes * t.copies for t in facts.tensors)
    positions = prompt_tokens + max_new_tokens
    kv = 2 * arch.num_layers * arch.kv_dim * act * batch_size * positions
    # Prefill of one layer at a time: q/k/v/attention output, MLP intermediates, residual.
    tokens = batch_size * prompt_tokens
    prefill = (
        tokens * act * (2 * arch.q_dim + 2 * arch.kv_dim + 3 * arch.intermediate_size + 2 * arch.hidden_size)
    )
    logits = batch_size * arch.vocab_size * 4 * 2  # fp32 scores and their processed copy
    allocated = weights + kv + prefill + logits
    total = allocated * (1 + C.EVAL_ALLOCATOR_SLACK_FRACTION) + C.CUDA_CONTEXT_BYTES
    return EvalMemory(
        weights_bytes=int(weights),
        kv_cache_bytes=int(kv),
        activations_bytes=int(prefill),
        logits_bytes=int(logits),
        cuda_context_bytes=C.CUDA_CONTEXT_BYTES,
        total_bytes=int(total),
        prompt_tokens=prompt_tokens,
    )
