"""LoRA targets as peft resolves them, and the trainable parameter counts they give."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.arch import Arch, Linear
from planner.errors import PlanError

__all__ = ["LoraTargets", "resolve_lora"]

_LAYER_PREFIX = "model.layers.0."
_NOT_ADAPTABLE = ("norm", "rotary_emb", "act_fn")


@dataclass(frozen=True, slots=True)
class LoraTargets:
    """Which modules carry adapters, and the trainable parameters they add."""

    r: int
    layer_linears: tuple[Linear, ...]  # adapted linears of one decoder layer
    lm_head: bool
    embed_tokens: bool
    trainable_parameters: int
    dropout: float

    @property
    def layer_trainable(self) -> int:
        return sum(self.r * (lin.in_features + lin.out_features) for lin in self.layer_linears)


def _matches(module_name: str, target: str) -> bool:
    # peft: a string entry matches a module whose name equals it or ends with "." + it.
    return module_name == target or module_name.endswith("." + target)


def _check_adaptable(targets: Sequence[str], arch: Arch) -> None:
    layer_names = [_LAYER_PREFIX + lin.name for lin in arch.linears]
    top_names = ["model.embed_tokens", "lm_head"]
    for index, target in enumerate(targets):
        if target == "all-linear":
            continue
        if any(_matches(name, target) for name in layer_names + top_names):
            continue
        where = f"lora.target_modules.{index}"
        if any(part in target for part in _NOT_ADAPTABLE):
            raise PlanError(where, f"{target!r} is not a Linear or Embedding layer; LoRA cannot adapt it")
        known = ", ".join(lin.name.split(".")[-1] for lin in arch.linears)
        raise PlanError(
            where,
            f"no module of a {arch.model_type} model matches {target!r} (its linear layers are: {known})",
        )


def resolve_lora(arch: Arch, r: int, targets: Sequence[str], dropout: float) -> LoraTargets:
    """Trainable parameters of ``get_peft_model`` with these settings (no bias, no DoRA)."""
    if r <= 0:
        raise PlanError("lora.r", f"must be positive, got {r}")
    if not targets:
        raise PlanError("lora.target_modules", "needs at least one module name")
    _check_adaptable(targets, arch)
    all_linear = "all-linear" in targets
    adapted = tuple(
        lin
        for lin in arch.linears
        if all_linear or any(_matches(_LAYER_PREFIX + lin.name, t) for t in targets)
    )
    # peft's "all-linear" leaves the output layer out.
    lm_head = any(_matches("lm_head", t) for t in targets)
    embed = any(_matches("model.embed_tokens", t) for t in targets)
    per_layer = sum(r * (lin.in_features + lin.out_features) for lin in adapted)
    total = arch.num_layers * per_layer
    if lm_head:
        total += r * (arch.hidden_size + arch.vocab_size)
    if embed:
        total += r * (arch.vocab_size + arch.hidden_size)
    return LoraTargets(
        r=r,
        layer_linears=adapted,
        lm_head=lm_head,
        embed_tokens=embed,
        trainable_parameters=total,
        dropout=dropout,
    )
