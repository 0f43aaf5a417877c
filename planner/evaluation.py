"""Memory of the separate evaluation process (``worker/evaluate.py``): the trained model computing
the eval loss, then generating with a KV cache.

The eval loss runs ``eval.batch_size`` rows of the training sequence length through the model
without a cache; the model returns every position's logits in its own dtype, and the loss upcasts
``EVAL_LOSS_CHUNK_POSITIONS`` positions of them at a time to fp32 (and as much again for their
log-softmax; a soft-capped model's capping makes one more copy of its logits). Generation: prompts
cut to their last ``seq_len - max_new_tokens`` tokens (as ``worker/evaluate.py`` cuts them), each
extended by ``eval.max_new_tokens``, logits of the last position only, beside the KV cache and one
layer's prefill. The two run one after the other: the peak is the larger, on top of the weights
(``bench/eval_memory.py`` measures it).
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
    facts: ModelFacts, precision: str, seq_len: int, max_new_tokens: int, batch_size: int
) -> EvalMemory:
    arch = facts.arch
    act = weight_bytes(precision)
    weights = sum(t.numel * t.elem_bytes * t.copies for t in facts.tensors)
    # generation keeps each prompt's last seq_len - max_new_tokens tokens (at least one), so that
    # prompt and answer together stay within the training's sequence length
    prompt_tokens = max(1, seq_len - max_new_tokens)
    positions = prompt_tokens + max_new_tokens
    kv = 2 * arch.num_layers * arch.kv_dim * act * batch_size * positions
    # Prefill of one layer at a time: q/k/v/attention output, MLP intermediates, residual.
    prefill = (
        batch_size
        * prompt_tokens
        * act
        * (2 * arch.q_dim + 2 * arch.kv_dim + 3 * arch.intermediate_size + 2 * arch.hidden_size)
    )
    tokens = batch_size * seq_len  # the eval loss's rows
    generated = batch_size * arch.vocab_size * 4 * 2  # fp32 scores and their processed copy
    # the eval loss: every position's logits in the model's dtype beside the final hidden states,
    # then a chunk of positions upcast with its log-softmax, or, where the logits are soft-capped,
    # the capping's one temporary as large as the logits
    logits_all = tokens * arch.vocab_size * act
    chunk = batch_size * min(seq_len, C.EVAL_LOSS_CHUNK_POSITIONS) * arch.vocab_size * 2 * _FP32
    capped = logits_all if arch.final_logit_softcapping else 0
    loss = logits_all + max(chunk, capped) + tokens * arch.hidden_size * act
    logits = max(loss, generated)
    allocated = weights + max(loss, prefill + kv + generated)
    slack = allocated * C.EVAL_ALLOCATOR_SLACK_FRACTION + C.EVAL_ALLOCATOR_SLACK_BYTES
    total = allocated + slack + C.EVAL_CUDA_CONTEXT_BYTES
    return EvalMemory(
        weights_bytes=int(weights),
        kv_cache_bytes=int(kv),
        activations_bytes=int(prefill),
        logits_bytes=int(logits),
        cuda_context_bytes=C.EVAL_CUDA_CONTEXT_BYTES,
        total_bytes=int(total),
        prompt_tokens=prompt_tokens,
    )
