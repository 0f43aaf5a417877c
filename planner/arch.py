"""Model architecture from an HF ``config.json``: exact parameter counts, per module.

Dense decoder families share one skeleton (embedding, N identical decoder layers, final norm, LM
head); what differs is listed per family: which projections carry biases, whether q/k/v and
gate/up are fused (phi3), how many norms a layer has (gemma2: four), q/k norms (qwen3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from planner.errors import PlanError

__all__ = ["Arch", "Linear", "SUPPORTED_MODEL_TYPES", "arch_from_config"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3")

# transformers' own defaults, used where a config.json leaves the field out.
_TIE_DEFAULT = {
    "llama": False,
    "mistral": False,
    "qwen2": False,
    "qwen3": False,
    "gemma": True,
    "gemma2": True,
    "phi3": False,
}
_MAX_POS_DEFAULT = {
    "llama": 2048,
    "mistral": 131072,
    "qwen2": 32768,
    "qwen3": 32768,
    "gemma": 8192,
    "gemma2": 8192,
    "phi3": 4096,
}


@dataclass(frozen=True, slots=True)
class Linear:
    """One ``nn.Linear`` of a decoder layer, named as in the HF module tree."""

    name: str  # dotted path inside a decoder layer, e.g. "self_attn.q_proj"
    in_features: int
    out_features: int
    bias: bool
    input_key: str  # which activation feeds it: "attn_in" | "attn_out" | "mlp_in" | "mlp_mid"

    @property
    def numel(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)


@dataclass(frozen=True, slots=True, eq=False)
class Arch:
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str | None
    linears: tuple[Linear, ...]  # of one decoder layer
    norm_sizes: tuple[int, ...]  # weights of one decoder layer's norms (incl. q/k norms)
    final_logit_softcapping: float | None
    attn_logit_softcapping: float | None  # Gemma 2 caps its attention logits (under eager attention)
    sliding_window: int | None

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_linear_params(self) -> int:
        return sum(lin.numel for lin in self.linears)

    @property
    def layer_params(self) -> int:
        return self.layer_linear_params + sum(self.norm_sizes)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters the LM head adds (0 when tied to the embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_parameters(self) -> int:
        """Exactly ``sum(p.numel() for p in model.parameters())`` of the HF model (tied counted once)."""
        return (
            self.embedding_params
            + self.num_layers * self.layer_params
            + self.hidden_size
            + self.lm_head_params
        )

    @property
    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token (embedding lookup excluded, LM head included)."""
        return self.num_layers * self.layer_linear_params + self.vocab_size * self.hidden_size

    @property
    def layer_tensor_sizes(self) -> tuple[int, ...]:
        """The element count of each parameter tensor of one decoder layer (weights, biases, norms)."""
        biases = tuple(lin.out_features for lin in self.linears if lin.bias)
        return tuple(lin.in_features * lin.out_features for lin in self.linears) + biases + self.norm_sizes

    @property
    def largest_param(self) -> int:
        """The largest single tensor (its gradient is the largest transient one)."""
        return _largest_param(self)


@lru_cache(maxsize=256)
def _largest_param(arch: Arch) -> int:
    # Asked once per searched candidate; Arch compares by identity, so this is a cheap memo.
    biggest_linear = max(lin.in_features * lin.out_features for lin in arch.linears)
    return max(biggest_linear, arch.embedding_params)


def _field(
    cfg: Mapping[str, Any], key: str, where: str, *, default: int | None = None, minimum: int = 1
) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise PlanError(f"{where}.{key}", "is required to plan this architecture")
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{where}.{key}", f"must be an integer, got {value!r}")
    if value < minimum:
        raise PlanError(f"{where}.{key}", f"must be at least {minimum}, got {value}")
    return value


def _head_dim(cfg: Mapping[str, Any], hidden: int, heads: int, where: str) -> int:
    explicit = cfg.get("head_dim")
    if explicit is not None:
        return _field(cfg, "head_dim", where)
    if hidden % heads:
        raise PlanError(
            f"{where}.num_attention_heads",
            f"{heads} heads do not divide hidden_size {hidden} (and no head_dim is given)",
        )
    return hidden // heads


def _linears(
    model_type: str, cfg: Mapping[str, Any], hidden: int, inter: int, q_dim: int, kv_dim: int
) -> tuple[Linear, ...]:
    if model_type == "phi3":
        return (
            Linear("self_attn.qkv_proj", hidden, q_dim + 2 * kv_dim, False, "attn_in"),
            Linear("self_attn.o_proj", q_dim, hidden, False, "attn_out"),
            Linear("mlp.gate_up_proj", hidden, 2 * inter, False, "mlp_in"),
            Linear("mlp.down_proj", inter, hidden, False, "mlp_mid"),
        )
    if model_type == "qwen2":  # Qwen2Attention hard-codes q/k/v biases
        qkv_bias, o_bias, mlp_bias = True, False, False
    else:
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
        mlp_bias = bool(cfg.get("mlp_bias", False)) if model_type == "llama" else False
    return (
        Linear("self_attn.q_proj", hidden, q_dim, qkv_bias, "attn_in"),
        Linear("self_attn.k_proj", hidden, kv_dim, qkv_bias, "attn_in"),
        Linear("self_attn.v_proj", hidden, kv_dim, qkv_bias, "attn_in"),
        Linear("self_attn.o_proj", q_dim, hidden, o_bias, "attn_out"),
        Linear("mlp.gate_proj", hidden, inter, mlp_bias, "mlp_in"),
        Linear("mlp.up_proj", hidden, inter, mlp_bias, "mlp_in"),
        Linear("mlp.down_proj", inter, hidden, mlp_bias, "mlp_mid"),
    )


def _norm_sizes(model_type: str, hidden: int, head_dim: int) -> tuple[int, ...]:
    if model_type == "gemma2":
        return (hidden,) * 4
    if model_type == "qwen3":
        return (hidden, hidden, head_dim, head_dim)
    return (hidden, hidden)


def _dtype(cfg: Mapping[str, Any]) -> str | None:
    value = cfg.get("torch_dtype", cfg.get("dtype"))
    return value if isinstance(value, str) else None


def _optional_float(cfg: Mapping[str, Any], key: str) -> float | None:
    value = cfg.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _softcap(cfg: Mapping[str, Any], key: str, default: float) -> float | None:
    if key not in cfg:
        return default  # Gemma2Config's
    return _optional_float(cfg, key)


def arch_from_config(cfg: Mapping[str, Any], where: str = "model.config") -> Arch:
    """Parse an HF config dict; ``where`` is the spec location named in errors."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise PlanError(
            f"{where}.model_type", "is required (one of " + ", ".join(SUPPORTED_MODEL_TYPES) + ")"
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise PlanError(
            f"{where}.model_type",
            f"{model_type!r} is not supported; supported: " + ", ".join(SUPPORTED_MODEL_TYPES),
        )
    hidden = _field(cfg, "hidden_size", where)
    layers = _field(cfg, "num_hidden_layers", where)
    heads = _field(cfg, "num_attention_heads", where)
    inter = _field(cfg, "intermediate_size", where)
    vocab = _field(cfg, "vocab_size", where)
    kv_heads = _field(cfg, "num_key_value_heads", where, default=heads)
    if heads % kv_heads:
        raise PlanError(
            f"{where}.num_key_value_heads",
            f"{kv_heads} key/value heads do not divide {heads} attention heads",
        )
    head_dim = _head_dim(cfg, hidden, heads, where)
    max_pos = _field(cfg, "max_position_embeddings", where, default=_MAX_POS_DEFAULT[model_type])
    tie = cfg.get("tie_word_embeddings", _TIE_DEFAULT[model_type])
    window = cfg.get("sliding_window")
    gemma2 = model_type == "gemma2"
    return Arch(
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(tie),
        torch_dtype=_dtype(cfg),
        linears=_linears(model_type, cfg, hidden, inter, heads * head_dim, kv_heads * head_dim),
        norm_sizes=_norm_sizes(model_type, hidden, head_dim),
        final_logit_softcapping=_softcap(cfg, "final_logit_softcapping", 30.0) if gemma2 else None,
        attn_logit_softcapping=_softcap(cfg, "attn_logit_softcapping", 50.0) if gemma2 else None,
        sliding_window=window if isinstance(window, int) and not isinstance(window, bool) else None,
    )
