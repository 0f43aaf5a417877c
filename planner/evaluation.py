"""Memory of the separate evaluation process (``worker/evaluate.py``): the trained model computing
the eval loss, then generating with a KV cache.

The eval loss runs ``eval.batch_size`` rows of the training sequence length through the model
without a cache; the model returns every position's logits in its own dtype, and the loss upcasts
``EVAL_LOSS_CHUNK_POSITIONS`` positions of them at a time to fp32 (and as much again for their
log-softmax). Generation, worst case: prompts as long as the training sequences, each extended by
``eval.max_new_tokens``, logits of the last position only. The two run one after the other: the
peak is the larger, on top of the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner import constants as C
from planner.memory import ModelFacts, weight_bytes

__all__ = ["EvalMemory", "estimate_eval"]

_FP32 = 4


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
    generated = batch_size * arch.vocab_size * 4 * 2  # fp32 scores and their processed copy
    chunk = min(prompt_tokens, C.EVAL_LOSS_CHUNK_POSITIONS)
    loss = batch_size * arch.vocab_size * (prompt_tokens * act + chunk * 2 * _FP32)
    logits = max(loss, generated)
    allocated = weights + prefill + max(loss, kv + generated)
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
