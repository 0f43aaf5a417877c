"""Parameter counts: exact against transformers' models and the published checkpoint sizes."""

from __future__ import annotations

from typing import Any

import pytest

from planner import PlanError, arch_from_config
from planner.catalogue import catalogue
from tests.planner.support import TINY_CONFIGS, hf_model


def _hf_numel(config: dict[str, Any]) -> int:
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        model = hf_model(config)
    return sum(p.numel() for p in model.parameters())  # tied tensors are yielded once


def test_catalogue_has_the_popular_families() -> None:
    entries = catalogue()
    assert len(entries) >= 15
    types = {e.config["model_type"] for e in entries.values()}
    assert {"qwen2", "llama", "mistral", "gemma", "gemma2", "phi3"} <= types
    assert all(e.source.startswith(f"https://huggingface.co/{name}/") for name, e in entries.items())


@pytest.mark.parametrize("name", sorted(catalogue()))
def test_catalogue_counts_match_published_sizes(name: str) -> None:
    entry = catalogue()[name]
    assert arch_from_config(entry.config).num_parameters == entry.num_parameters


@pytest.mark.parametrize(
    "name",
    [
        "Qwen/Qwen2.5-0.5B",
        "Qwen/Qwen2.5-7B",
        "meta-llama/Llama-3.2-1B",
        "meta-llama/Llama-3.1-70B",
        "mistralai/Mistral-7B-v0.3",
        "google/gemma-2-9b",
        "google/gemma-7b",
        "microsoft/Phi-3-mini-4k-instruct",
    ],
)
def test_catalogue_counts_match_transformers(name: str) -> None:
    config = catalogue()[name].config
    assert arch_from_config(config).num_parameters == _hf_numel(config)


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_tiny_counts_match_transformers(family: str) -> None:
    config = TINY_CONFIGS[family]
    assert arch_from_config(config).num_parameters == _hf_numel(config)


def _broken(**changes: Any) -> dict[str, Any]:
    config = dict(TINY_CONFIGS["llama"])
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    return config


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hidden_size": None}, "model.config.hidden_size"),
        ({"num_hidden_layers": 0}, "model.config.num_hidden_layers"),
        ({"num_attention_heads": 7, "num_key_value_heads": 7}, "model.config.num_attention_heads"),
        ({"num_key_value_heads": 3}, "model.config.num_key_value_heads"),
        ({"vocab_size": "big"}, "model.config.vocab_size"),
        ({"model_type": "gpt2"}, "model.config.model_type"),
        ({"model_type": None}, "model.config.model_type"),
    ],
)
def test_bad_configs_name_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(PlanError) as info:
        arch_from_config(_broken(**changes))
    assert info.value.field == field
    assert isinstance(info.value, ValueError)


def test_explicit_head_dim_need_not_divide_hidden() -> None:
    arch = arch_from_config(_broken(num_attention_heads=7, head_dim=64, num_key_value_heads=7))
    assert arch.q_dim == 7 * 64
