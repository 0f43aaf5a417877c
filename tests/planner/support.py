"""Helpers of the planner tests: tiny configs of every supported family, the HF models built from
them, an H200 box."""

from __future__ import annotations

import os
from typing import Any

H200_BYTES = 143_771_156_480
GIB = 1024**3

# DeepSpeed on this machine runs on the CPU accelerator; set before anything imports it.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

_BASE = dict(
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=1000,
    max_position_embeddings=512,
)

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", **_BASE},
    "llama-biases-untied": {
        "model_type": "llama",
        **_BASE,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": False,
    },
    "llama-tied": {"model_type": "llama", **_BASE, "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2", **_BASE, "tie_word_embeddings": True},
    "qwen3": {"model_type": "qwen3", **_BASE, "head_dim": 48},
    "mistral": {"model_type": "mistral", **_BASE, "num_key_value_heads": 8},
    "gemma": {"model_type": "gemma", **_BASE, "head_dim": 48},
    "gemma2": {"model_type": "gemma2", **_BASE, "head_dim": 32},
    "phi3": {"model_type": "phi3", **_BASE, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1},
}


def hf_model(config: dict[str, Any], **from_config: Any) -> Any:
    """The transformers causal LM of one of these configs (random weights; fields may be
    overridden in ``config``), ``from_config`` going to ``AutoModelForCausalLM.from_config``."""
    import pytest

    transformers = pytest.importorskip("transformers")
    cfg = dict(config)
    hf_config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    return transformers.AutoModelForCausalLM.from_config(hf_config, **from_config)


def hardware(
    gpus: int = 1, gpu_bytes: int = H200_BYTES, host_gib: int = 128, nvme_gib: int = 0
) -> dict[str, Any]:
    return {
        "gpu_count": gpus,
        "gpu_memory_bytes": gpu_bytes,
        "host_memory_bytes": host_gib * GIB,
        "nvme_bytes": nvme_gib * GIB,
    }


def job(**overrides: Any) -> dict[str, Any]:
    """A small explicit job spec; keyword groups replace the defaults' groups."""
    spec: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-0.5B"},
        "method": "lora",
        "training": {
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 4,
            "seq_len": 1024,
            "gradient_checkpointing": False,
        },
        "resources": {"num_gpus": 1, "zero_stage": 2, "offload_optimizer": "none", "offload_param": "none"},
        "hardware": hardware(),
    }
    spec.update(overrides)
    return spec
