"""The operations one decoder layer dispatches in a forward and in a backward pass.

The host's share of a training step is paid per operation: the Python of the module, autograd's
bookkeeping and the kernel launch. On the GPU box most steps of a small model are bound by it, and
layers differ: Gemma 2's has four norms to Llama's two, a LoRA adapter adds its own small matmuls.
These counts are transformers' decoder layers as PyTorch's dispatcher sees them, views and
allocations left out (``tests/planner/test_ops.py`` counts the installed transformers' layers, every
supported family, and holds these within a few percent):

- an RMSNorm: forward 8 (upcast, square, mean, add epsilon, rsqrt, scale, downcast, weight),
  backward 16, 14 when its weight is frozen (LoRA); Gemma's, which multiplies by ``1 + weight``:
  10 and 17 (15);
- a projection (q, k, v, o, gate, up, down; Phi-3's fused ``qkv_proj`` and ``gate_up_proj`` count
  as their parts: the copies splitting their outputs stand in for the separate matmuls): forward 1,
  backward 1 for the input's gradient, 1 more for a trainable weight's, 1 more for a trainable
  bias's;
- the rest of the layer (rotary embedding of queries and keys, attention, the two residual adds,
  the MLP's activation and product): forward 15, backward 25 with SDPA; eager attention adds its
  two matmuls, scaling, mask, softmax and casts (9 and 10), and Gemma 2's soft-capping of the
  attention logits 3 and 6 more;
- a LoRA adapter in the model's dtype (DeepSpeed's bf16 engine casts peft's fp32 adapters): forward
  7 (dropout's mask and scale, A, B, scaling, the add), backward 7; without dropout 4 and 6;
- a 4-bit QLoRA weight counts as a projection: what bitsandbytes' dequantization costs the host is
  charged per call by ``planner/speed.py``, as measured (``bench/qlora_kernels.py``), not as operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.arch import Arch
from planner.lora import LoraTargets

__all__ = ["LayerOps", "layer_modules", "layer_ops"]

_NORM = (8, 16)
_GEMMA_NORM = (10, 17)
_FROZEN_NORM_WEIGHT = 2  # the backward's product and sum for the weight's gradient
_REST = (15, 25)
_EAGER_ATTENTION = (9, 10)
_ATTENTION_SOFTCAP = (3, 6)
_ADAPTER = (7, 7)
_ADAPTER_NO_DROPOUT = (4, 6)

#: Modules a decoder layer runs besides its norms and linears: the layer, attention, MLP, activation.
_LAYER_MODULES = 4
#: Modules peft runs per adapted linear: its wrapper, the dropout (or identity), A and B.
_ADAPTER_MODULES = 4
#: Phi-3's decoder layer runs two residual dropouts as modules of their own.
_EXTRA_MODULES = {"phi3": 2}

#: Fused projections and the projections they stand for.
_FUSED_PARTS = {"qkv_proj": 3, "gate_up_proj": 2}


@dataclass(frozen=True, slots=True)
class LayerOps:
    """Operations of one decoder layer: a forward pass (run twice under gradient checkpointing)
    and a backward pass."""

    forward: int
    backward: int

    def per_micro_step(self, checkpointing: bool) -> int:
        return self.forward * (2 if checkpointing else 1) + self.backward


def _parts(name: str) -> int:
    return _FUSED_PARTS.get(name.rsplit(".", 1)[-1], 1)


@lru_cache(maxsize=256)
def layer_ops(arch: Arch, method: str, lora: LoraTargets | None, attn_implementation: str) -> LayerOps:
    """One decoder layer's operations for ``method`` (``full``, ``lora`` or ``qlora``)."""
    full = method == "full"
    norm = _GEMMA_NORM if arch.model_type in ("gemma", "gemma2") else _NORM
    norm_backward = norm[1] if full else norm[1] - _FROZEN_NORM_WEIGHT
    norms = len(arch.norm_sizes)
    forward, backward = norms * norm[0] + _REST[0], norms * norm_backward + _REST[1]
    if attn_implementation == "eager":
        forward, backward = forward + _EAGER_ATTENTION[0], backward + _EAGER_ATTENTION[1]
        if arch.attn_logit_softcapping is not None:
            forward, backward = forward + _ATTENTION_SOFTCAP[0], backward + _ATTENTION_SOFTCAP[1]
    for lin in arch.linears:
        parts = _parts(lin.name)
        forward += parts
        backward += parts * (2 if full else 1) + (1 if full and lin.bias else 0)
    if lora is not None:
        adapter = _ADAPTER if lora.dropout > 0 else _ADAPTER_NO_DROPOUT
        forward += len(lora.layer_linears) * adapter[0]
        backward += len(lora.layer_linears) * adapter[1]
    return LayerOps(forward, backward)


@lru_cache(maxsize=256)
def layer_modules(arch: Arch, lora: LoraTargets | None) -> int:
    """The ``nn.Module`` calls of one decoder layer's forward, each of which ZeRO-3's fetch and
    release hooks run on: the layer, its attention, MLP, activation, norms and linears (Phi-3's
    residual dropouts too), and per LoRA adapter peft's wrapper, dropout, A and B."""
    adapters = len(lora.layer_linears) if lora else 0
    return (
        _LAYER_MODULES
        + len(arch.norm_sizes)
        + len(arch.linears)
        + _EXTRA_MODULES.get(arch.model_type, 0)
        + _ADAPTER_MODULES * adapters
    )
