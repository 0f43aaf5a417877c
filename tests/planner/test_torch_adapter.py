"""The torch adapter counts a live model the way the planner counts its config."""

from __future__ import annotations

import pytest

from planner import arch_from_config, resolve_lora
from tests.planner.support import TINY_CONFIGS, hf_model


@pytest.mark.parametrize("family", ["llama-tied", "phi3", "gemma2"])
def test_adapter_agrees_with_the_planner(family: str) -> None:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from planner.torch_adapter import count_parameters

    arch = arch_from_config(TINY_CONFIGS[family])
    with torch.device("meta"):
        model = hf_model(TINY_CONFIGS[family])
    counted = count_parameters(model)
    assert counted.total == counted.trainable == arch.num_parameters
    assert counted.largest_tensor == arch.largest_param
    targets = ["o_proj", "down_proj"]
    lora_model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=targets))
    counted = count_parameters(lora_model)
    assert counted.trainable == resolve_lora(arch, 8, targets, 0.0).trainable_parameters
    assert counted.total == arch.num_parameters + counted.trainable
