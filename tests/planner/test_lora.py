"""LoRA trainable counts: exact against peft on tiny models."""

from __future__ import annotations

from typing import Any

import pytest

from planner import PlanError, arch_from_config, resolve_lora
from tests.planner.support import TINY_CONFIGS, hf_model

CASES = [
    ("llama", ["q_proj", "k_proj", "v_proj", "o_proj"]),
    ("llama", ["all-linear"]),
    ("llama-biases-untied", ["q_proj", "v_proj", "down_proj", "lm_head"]),
    ("qwen2", ["self_attn.q_proj", "mlp.up_proj"]),
    ("gemma2", ["q_proj", "gate_proj", "up_proj", "down_proj"]),
    ("phi3", ["qkv_proj", "o_proj", "gate_up_proj"]),
    ("qwen3", ["all-linear"]),
]


def _peft_trainable(config: dict[str, Any], r: int, targets: list[str]) -> int:
    pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    model = hf_model(config)
    target: str | list[str] = "all-linear" if targets == ["all-linear"] else targets
    peft_model = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=target))
    trainable, _ = peft_model.get_nb_trainable_parameters()
    return int(trainable)


@pytest.mark.parametrize(("family", "targets"), CASES)
@pytest.mark.parametrize("r", [4, 16])
def test_trainable_counts_match_peft(family: str, targets: list[str], r: int) -> None:
    config = TINY_CONFIGS[family]
    ours = resolve_lora(arch_from_config(config), r, targets, 0.05).trainable_parameters
    assert ours == _peft_trainable(config, r, targets)


def test_rank_must_be_positive() -> None:
    with pytest.raises(PlanError) as info:
        resolve_lora(arch_from_config(TINY_CONFIGS["llama"]), 0, ["q_proj"], 0.0)
    assert info.value.field == "lora.r"


def test_unknown_target_names_its_index() -> None:
    arch = arch_from_config(TINY_CONFIGS["phi3"])
    with pytest.raises(PlanError) as info:
        resolve_lora(arch, 8, ["qkv_proj", "q_proj"], 0.0)
    assert info.value.field == "lora.target_modules.1"
    assert "qkv_proj" in info.value.message


def test_norms_cannot_be_adapted() -> None:
    arch = arch_from_config(TINY_CONFIGS["llama"])
    with pytest.raises(PlanError, match="not a Linear"):
        resolve_lora(arch, 8, ["input_layernorm"], 0.0)
