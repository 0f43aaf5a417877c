"""Activation memory of one training micro-step of an HF decoder, from what autograd saves.

Counted per token and per decoder layer, from the tensors PyTorch keeps for backward in HF's
modelling code (transformers 5, SDPA attention, bf16):

* an RMSNorm saves its fp32 upcast input (4 B/elem); with a trainable weight also the normalised
  input in the weight's dtype (llama-type) or in fp32 (gemma-type, ``x * (1 + w)``);
* a Linear saves its input only when its weight is trainable (autograd saves what the needed
  gradients use); a LoRA adapter saves its dropout output and mask (or the shared input when
  dropout is 0) and the rank-r intermediate;
* under ZeRO-3, ``zero.Init`` replaces ``torch.nn.functional.linear`` for the rest of the process
  with DeepSpeed's ``LinearFunctionForZeroStage3``, which saves every input, frozen weight or not
  (the LM head's too); and peft's adapters stay fp32 (``autocast_adapter_dtype``; DeepSpeed casts
  parameters to bf16 only for a model it did not build), so each adapter saves its own fp32 copy
  of the input and an fp32 rank-r intermediate;
* SDPA (flash / memory-efficient kernels) saves q and k after RoPE, v, the output and the fp32
  log-sum-exp per head; eager attention adds the fp32 softmax and its bf16 copy, seq^2 per head,
  and expands grouped k/v to all heads. Given an explicit mask (rows that pack several sequences or
  carry padding), SDPA's memory-efficient kernel saves, in every layer, its own copy of the mask
  in the activations' dtype (a row's seq^2, shared by the heads), and transformers expands grouped
  k/v to all heads first (it uses SDPA's own grouped-query support only without a mask);
* the gated MLP saves the gate output (activation input), the activation output and the up output;
* the loss upcasts the logits to fp32; at the start of backward the saved log-softmax, the
  gradient arriving and the gradient leaving are all vocab-sized fp32 tensors.

With gradient checkpointing (non-reentrant) a layer keeps only its input hidden state; in
backward one layer is recomputed and its gradients are live.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.arch import Arch
from planner.lora import LoraTargets
from planner.setup import Setup

__all__ = [
    "ActivationEstimate",
    "estimate_activations",
    "logits_bytes_per_token",
    "saved_after_forward_bytes",
]

_FP32 = 4
_MASK = 1  # dropout keeps a bool mask


@dataclass(frozen=True, slots=True)
class ActivationEstimate:
    """Peak activation bytes of one micro-step on one GPU."""

    activations_bytes: int  # the activation peak minus the logits/loss part
    logits_bytes: int  # vocab-sized logits and loss tensors at their peak
    activations_full_bytes: int  # activations_bytes without checkpointing
    activations_checkpointed_bytes: int  # activations_bytes with checkpointing
    #: Saved for backward when the loss is computed: the peak sits here, next to the logits,
    #: before any gradient or ZeRO reduction bucket exists.
    kept_at_loss_bytes: int = 0
    #: Peak later in backward, without the logits: recomputed layer, its gradients in flight.
    backward_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        return self.activations_bytes + self.logits_bytes


def _norm_bytes(elements: int, act: int, trainable: bool, gemma_type: bool) -> int:
    rsqrt = _FP32  # the per-row 1/rms
    if not trainable:
        return _FP32 * elements + rsqrt
    return (_FP32 + (_FP32 if gemma_type else act)) * elements + rsqrt


def _adapter_bytes(act: int, zero3: bool) -> int:
    """Element size of a LoRA adapter's activations: fp32 adapters under ZeRO-3 (see above)."""
    return _FP32 if zero3 else act


def _linear_inputs(
    arch: Arch, act: int, full: bool, lora: LoraTargets | None, sdpa_keeps_out: bool, zero3: bool
) -> int:
    total = 0
    adapted = {lin.name for lin in lora.layer_linears} if lora else set()
    dropout = lora is not None and lora.dropout > 0
    lora_act = _adapter_bytes(act, zero3)
    # An adapter without dropout saves the layer's own input only when it needs no dtype cast.
    adapter_copies = dropout or lora_act != act
    for key in ("attn_in", "attn_out", "mlp_in", "mlp_mid"):
        group = [lin for lin in arch.linears if lin.input_key == key]
        if not group:
            continue
        width = group[0].in_features
        shared = full or zero3 or any(lin.name in adapted and not adapter_copies for lin in group)
        if shared and not (key == "attn_out" and sdpa_keeps_out):
            total += act * width
        for lin in group:
            if lin.name in adapted:
                total += lora_act * lora.r if lora else 0  # lora_A output, saved by lora_B
                if dropout:
                    total += (lora_act + _MASK) * width
                elif adapter_copies:
                    total += lora_act * width
    return total


def _attention_bytes(arch: Arch, act: int, setup: Setup) -> int:
    q, kv = arch.q_dim, arch.kv_dim
    v_bytes = act * (q + 2 * kv) if arch.model_type == "phi3" else act * kv  # v views the fused qkv
    if setup.attn_implementation == "eager":
        scores = (_FP32 + act) * arch.num_heads * setup.seq_len
        if arch.model_type == "gemma2":
            scores += act * arch.num_heads * setup.seq_len  # tanh of the logit soft-capping
        expanded_kv = 2 * act * q  # repeat_kv copies k and v to every head (a no-op without GQA)
        return act * q + expanded_kv + scores
    lse = _FP32 * arch.num_heads
    k_bytes, mask = act * kv, 0
    if setup.attention_mask and setup.attn_implementation == "sdpa":
        mask = act * setup.seq_len  # a row's seq x seq mask, per token of the row
        if kv < q:  # grouped k/v expanded to every head
            k_bytes = v_bytes = act * q
    return act * q + k_bytes + v_bytes + act * q + lse + mask


def _layer_saved(arch: Arch, setup: Setup, lora: LoraTargets | None, act: int) -> int:
    full = setup.method == "full"
    gemma_type = arch.model_type.startswith("gemma")
    hidden_norms = 4 if arch.model_type == "gemma2" else 2
    total = hidden_norms * _norm_bytes(arch.hidden_size, act, full, gemma_type)
    if arch.model_type == "qwen3":
        total += _norm_bytes(arch.q_dim + arch.kv_dim, act, full, False)
    total += _attention_bytes(arch, act, setup)
    zero3 = setup.zero_stage == 3
    total += _linear_inputs(arch, act, full, lora, setup.attn_implementation != "eager", zero3)
    total += 3 * act * arch.intermediate_size
    return total


def _layer_backward_transient(arch: Arch, setup: Setup, act: int) -> int:
    # Gradients of the MLP intermediates, of the residual stream and the fp32 norm gradients.
    transient = 3 * act * arch.intermediate_size + 2 * _FP32 * arch.hidden_size + 2 * act * arch.hidden_size
    if setup.attn_implementation == "eager":
        transient += 2 * act * arch.num_heads * setup.seq_len  # scaled and masked scores
    return transient


def _final_saved(arch: Arch, setup: Setup, lora: LoraTargets | None, act: int) -> int:
    full = setup.method == "full"
    total = _norm_bytes(arch.hidden_size, act, full, arch.model_type.startswith("gemma"))
    if full or setup.zero_stage == 3 or (lora is not None and lora.lm_head):
        total += act * arch.hidden_size  # the LM head's input
    return total


def _frozen_prefix(arch: Arch, setup: Setup, lora: LoraTargets | None, act: int) -> int:
    # With a frozen embedding nothing before the first adapter needs a gradient: the first
    # layer's input norm saves nothing.
    if setup.method == "full" or (lora is not None and lora.embed_tokens):
        return 0
    frozen = _norm_bytes(arch.hidden_size, act, False, False)
    if setup.zero_stage == 3:  # nor do the first layer's q/k/v base linears save their input
        frozen += act * _width(arch, "attn_in")
    return frozen


def _width(arch: Arch, key: str) -> int:
    return next((lin.in_features for lin in arch.linears if lin.input_key == key), 0)


def logits_bytes_per_token(arch: Arch, act: int) -> int:
    # Backward of the loss: saved fp32 log-softmax + incoming and outgoing fp32 gradients; the
    # forward's bf16 logits + fp32 copy + log-softmax is smaller ((act + 8) <= 12 bytes).
    per_token = max(3 * _FP32, act + 2 * _FP32) * arch.vocab_size
    if arch.final_logit_softcapping:
        # tanh saves its output; the scaled logits it becomes are freed once the loss upcasts them
        per_token += act * arch.vocab_size
    return per_token


def _moments(arch: Arch, setup: Setup, lora: LoraTargets | None, checkpointing: bool) -> tuple[int, int]:
    """(saved at the loss, backward peak without logits), bytes per token."""
    act = 4 if setup.precision == "fp32" else 2
    layer = _layer_saved(arch, setup, lora, act)
    transient = _layer_backward_transient(arch, setup, act)
    final = _final_saved(arch, setup, lora, act)
    if checkpointing:
        kept = arch.num_layers * act * arch.hidden_size + final
        return kept, kept + layer + transient
    kept = arch.num_layers * layer + final - _frozen_prefix(arch, setup, lora, act)
    return kept, kept + transient


def _activation_peak(arch: Arch, setup: Setup, lora: LoraTargets | None, checkpointing: bool) -> int:
    act = 4 if setup.precision == "fp32" else 2
    kept, backward = _moments(arch, setup, lora, checkpointing)
    tokens = setup.tokens_per_micro_batch
    return max(kept * tokens + logits_bytes_per_token(arch, act) * setup.logits_tokens, backward * tokens)


def estimate_activations(arch: Arch, setup: Setup, lora: LoraTargets | None) -> ActivationEstimate:
    act = 4 if setup.precision == "fp32" else 2
    logits = logits_bytes_per_token(arch, act) * setup.logits_tokens
    full = _activation_peak(arch, setup, lora, False) - logits
    ckpt = _activation_peak(arch, setup, lora, True) - logits
    kept, backward = _moments(arch, setup, lora, setup.gradient_checkpointing)
    return ActivationEstimate(
        activations_bytes=ckpt if setup.gradient_checkpointing else full,
        logits_bytes=logits,
        activations_full_bytes=full,
        activations_checkpointed_bytes=ckpt,
        kept_at_loss_bytes=kept * setup.tokens_per_micro_batch,
        backward_bytes=backward * setup.tokens_per_micro_batch,
    )


def saved_after_forward_bytes(arch: Arch, setup: Setup, lora: LoraTargets | None) -> int:
    """Bytes autograd holds for backward when the forward returns (no checkpointing): the layers'
    saved tensors, the final norm's, the fp32 log-softmax and any soft-capped logits. This is
    what ``torch.autograd.graph.saved_tensors_hooks`` sees, and what the tests compare against."""
    act = 4 if setup.precision == "fp32" else 2
    kept = (
        arch.num_layers * _layer_saved(arch, setup, lora, act)
        + _final_saved(arch, setup, lora, act)
        - _frozen_prefix(arch, setup, lora, act)
    )
    loss = _FP32 * arch.vocab_size + (act * arch.vocab_size if arch.final_logit_softcapping else 0)
    return (kept + loss) * setup.tokens_per_micro_batch
