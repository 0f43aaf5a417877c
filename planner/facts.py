"""The model's tensors for a training method: sizes, storage bytes and which ones train."""

from __future__ import annotations

from planner.arch import Arch
from planner.lora import LoraTargets
from planner.memory import NF4_BYTES_PER_PARAM, ModelFacts, Tensor, weight_bytes

__all__ = ["model_facts"]


def _layer_tensors(arch: Arch, method: str, lora: LoraTargets | None, w: int) -> list[Tensor]:
    full = method == "full"
    linear_bytes = NF4_BYTES_PER_PARAM if method == "qlora" else float(w)
    tensors: list[Tensor] = []
    for lin in arch.linears:
        tensors.append(Tensor(lin.in_features * lin.out_features, linear_bytes, full, arch.num_layers))
        if lin.bias:
            tensors.append(Tensor(lin.out_features, float(w), full, arch.num_layers))
    tensors += [Tensor(size, float(w), full, arch.num_layers) for size in arch.norm_sizes]
    if lora is not None:
        for lin in lora.layer_linears:
            tensors.append(Tensor(lora.r * lin.in_features, float(w), True, arch.num_layers))
            tensors.append(Tensor(lin.out_features * lora.r, float(w), True, arch.num_layers))
    return tensors


def _top_tensors(arch: Arch, method: str, lora: LoraTargets | None, w: int) -> list[Tensor]:
    full = method == "full"
    vh = arch.vocab_size * arch.hidden_size
    tensors = [Tensor(vh, float(w), full, 1), Tensor(arch.hidden_size, float(w), full, 1)]
    if not arch.tie_word_embeddings:
        tensors.append(Tensor(vh, float(w), full, 1))  # bitsandbytes leaves the LM head unquantised
    if lora is not None:
        for adapted in (lora.lm_head, lora.embed_tokens):
            if adapted:
                tensors.append(Tensor(lora.r * arch.hidden_size, float(w), True, 1))
                tensors.append(Tensor(lora.r * arch.vocab_size, float(w), True, 1))
    return tensors


def model_facts(
    arch: Arch, method: str, lora: LoraTargets | None, precision: str, shard_bytes: int | None = None
) -> ModelFacts:
    """Tensors as the training process holds them after ``deepspeed.initialize`` (weights cast);
    ``shard_bytes`` is the checkpoint's largest weight file, where known."""
    w = weight_bytes(precision)
    use_lora = lora if method in ("lora", "qlora") else None
    layer = _layer_tensors(arch, method, use_lora, w)
    tensors = tuple(layer + _top_tensors(arch, method, use_lora, w))
    trainable = (
        arch.num_parameters if method == "full" else (use_lora.trainable_parameters if use_lora else 0)
    )
    layer_single = tuple(Tensor(t.numel, t.elem_bytes, t.trainable, 1) for t in layer)
    return ModelFacts(
        arch=arch,
        lora=use_lora,
        tensors=tensors,
        layer_tensors=layer_single,
        num_parameters=arch.num_parameters,
        trainable_parameters=trainable,
        checkpoint_shard_bytes=shard_bytes,
    )
