"""The benchmark matrix: real model architectures × ZeRO stage × offload × checkpointing × shape.

Each case is a JobSpec-shaped dict (``planner.spec.JobSpec`` validates it) plus what the harness
needs to schedule it: how many measured optimizer steps, and an estimate of its wall time on one
H200 so a run with a wall-clock budget can skip what would not finish.

The order is the run order: a ``core`` group of small single-GPU cases that together fit in about
eight minutes on one H200 comes first, then the rest. No torch here: ``--list`` and the tests read
this module on any machine.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

from planner.catalogue import lookup

# config.json of each model as published (architecture fields verbatim; only the fields that
# describe the network, which is all ``from_config`` reads).

# https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
QWEN25_05B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# https://huggingface.co/Qwen/Qwen2.5-1.5B/blob/main/config.json
QWEN25_15B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 1536,
    "initializer_range": 0.02,
    "intermediate_size": 8960,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 12,
    "num_hidden_layers": 28,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# https://huggingface.co/Qwen/Qwen2.5-3B/blob/main/config.json
QWEN25_3B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 32768,
    "max_window_layers": 36,
    "model_type": "qwen2",
    "num_attention_heads": 16,
    "num_hidden_layers": 36,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json (untied lm_head, vocab 152064)
QWEN25_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}

# https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
LLAMA32_1B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}


# Qwen/Qwen3-4B config.json: a family no other matrix ran (query and key norms in every layer).
QWEN3_4B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def _catalogued(name: str) -> dict[str, Any]:
    """Architecture fields of a model in the planner's catalogue (each entry cites its config.json)."""
    return copy.deepcopy(lookup(name).config)


MODELS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": QWEN25_05B,
    "qwen2.5-1.5b": QWEN25_15B,
    "qwen2.5-3b": QWEN25_3B,
    "qwen2.5-7b": QWEN25_7B,
    "llama-3.2-1b": LLAMA32_1B,
    # Families and sizes only the held-out matrix uses: the constants never saw them.
    "llama-3.2-3b": _catalogued("meta-llama/Llama-3.2-3B"),
    "mistral-7b-v0.3": _catalogued("mistralai/Mistral-7B-v0.3"),
    "phi-3-mini": _catalogued("microsoft/Phi-3-mini-4k-instruct"),
    "gemma-2-2b": _catalogued("google/gemma-2-2b"),
    # Only in the third held-out matrix.
    "llama-3.1-8b": _catalogued("meta-llama/Llama-3.1-8B"),
    # Only in the tenth held-out matrix.
    "gemma-2-9b": _catalogued("google/gemma-2-9b"),
    "gemma-7b": _catalogued("google/gemma-7b"),
    "qwen2.5-14b": _catalogued("Qwen/Qwen2.5-14B"),
    "llama-3-8b": _catalogued("meta-llama/Meta-Llama-3-8B"),
    "mistral-7b-v0.1": _catalogued("mistralai/Mistral-7B-v0.1"),
    # Only in the logits matrix: Gemma 2 2B with its final logit soft-capping switched off, to
    # tell the soft-capping's blocks from the rest of the family's.
    "gemma-2-2b-nosoftcap": {**_catalogued("google/gemma-2-2b"), "final_logit_softcapping": None},
    # Only in the twenty-fifth held-out matrix.
    "qwen3-4b": QWEN3_4B,
}

# The machine the matrix was written for: one H200 (143771 MiB as NVML reports it) in a host of
# 128 GiB per GPU. The harness replaces the GPU figures with what it finds on the machine.
H200_MEMORY_BYTES = 143771 * 2**20
HOST_MEMORY_PER_GPU_BYTES = 128 * 2**30

# The ZeRO knobs every case pins (the service's defaults); a case may override any of them.
ZERO_COMMON: dict[str, Any] = {
    "overlap_comm": True,
    "contiguous_gradients": True,
    "reduce_bucket_size": 5e8,
}
ZERO_STAGE12: dict[str, Any] = {"allgather_bucket_size": 5e8}
ZERO_STAGE3: dict[str, Any] = {
    "stage3_prefetch_bucket_size": 5e8,
    "stage3_param_persistence_threshold": 1e5,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
}


def hf_config(config: dict[str, Any]) -> Any:
    """transformers' config object of a published ``config.json`` (a ``MODELS`` entry, or a spec's
    ``model.config``), as every benchmark builds its random-weight model from it."""
    from transformers import AutoConfig

    return AutoConfig.for_model(**config)


def zero_knobs(stage: int) -> dict[str, Any]:
    """The ZeRO knobs that apply to ``stage`` (none for stage 0, which has no ZeRO section)."""
    if stage == 0:
        return {}
    extra = ZERO_STAGE3 if stage == 3 else ZERO_STAGE12
    return {**ZERO_COMMON, **extra}


@dataclass(frozen=True)
class Case:
    name: str
    spec: dict[str, Any]
    est_seconds: float
    measured_steps: int = 3
    group: str = "rest"
    expect: str = "ok"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_gpus(self) -> int:
        return int(self.spec["resources"]["num_gpus"])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.spec, "est_seconds": self.est_seconds,
                "measured_steps": self.measured_steps, "group": self.group, "expect": self.expect}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Case:
        return cls(name=d["name"], spec=d["spec"], est_seconds=float(d.get("est_seconds", 120)),
                   measured_steps=int(d.get("measured_steps", 3)), group=d.get("group", "custom"),
                   expect=d.get("expect", "ok"))


def param_count(cfg: dict[str, Any]) -> int:
    """Parameters of a llama/qwen2-style decoder from its config (for time estimates only)."""
    h, n_layers, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or h // heads
    vocab = cfg["vocab_size"]
    qkv_bias = cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias"))
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + (heads * hd + 2 * kv * hd) * qkv_bias
    per_layer = attn + 3 * h * inter + 2 * h
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return int(embed + n_layers * per_layer + h)


def lora_param_count(cfg: dict[str, Any], r: int, targets: list[str]) -> int:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    shapes = {"q_proj": (h, heads * hd), "k_proj": (h, kv * hd), "v_proj": (h, kv * hd),
              "o_proj": (heads * hd, h), "gate_proj": (h, cfg["intermediate_size"]),
              "up_proj": (h, cfg["intermediate_size"]), "down_proj": (cfg["intermediate_size"], h),
              "qkv_proj": (h, (heads + 2 * kv) * hd), "gate_up_proj": (h, 2 * cfg["intermediate_size"])}
    return int(cfg["num_hidden_layers"] * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets))


# Rough H200 rates for the time estimate; the estimate only decides what fits a budget, so it
# errs long. Recorded wall times are the truth (see bench/README.md).
STARTUP_S = 16.0            # interpreter, torch/deepspeed/transformers imports, CUDA + NCCL init
INIT_S_PER_BPARAM = 1.5     # random init on the GPU + engine setup, per billion parameters
ZERO3_INIT_FACTOR = 2.0     # zero.Init partitions while constructing
OFFLOAD_INIT_S_PER_BPARAM = 5.0   # pinned host buffers and CPU optimizer states
GPU_FLOPS = 250e12          # achieved bf16 training rate on an H200
ZERO3_LAYER_LATENCY_S = 0.004     # fetch/release per layer per micro-step, small models are bound by it
PCIE_BYTES_PER_S = 15e9
CPU_ADAM_PARAMS_PER_S = 1.0e9
SAFETY = 1.3


def estimate_seconds(spec: dict[str, Any], measured_steps: int) -> float:
    cfg, tr, res = spec["model"]["config"], spec["training"], spec["resources"]
    params = param_count(cfg)
    lora = spec["method"] == "lora"
    trainable = (lora_param_count(cfg, spec["lora"]["r"], spec["lora"]["target_modules"])
                 if lora else params)
    stage, gpus = res["zero_stage"], res["num_gpus"]
    off_opt, off_param = res["offload_optimizer"] == "cpu", res["offload_param"] == "cpu"
    ckpt = bool(tr["gradient_checkpointing"])
    tokens = tr["micro_batch_size"] * tr["seq_len"]

    init = INIT_S_PER_BPARAM * params / 1e9 * (ZERO3_INIT_FACTOR if stage == 3 else 1.0)
    if off_opt or off_param:
        init += OFFLOAD_INIT_S_PER_BPARAM * (trainable if off_opt else 0) / 1e9 / gpus
        init += OFFLOAD_INIT_S_PER_BPARAM * 0.3 * (params if off_param else 0) / 1e9

    flop_factor = (4 if lora else 6) + (2 if ckpt else 0)
    attn = 6 * cfg["num_hidden_layers"] * cfg["hidden_size"] * tr["seq_len"] * tokens
    micro = (flop_factor * params * tokens + attn) / GPU_FLOPS
    if stage == 3:
        micro += ZERO3_LAYER_LATENCY_S * cfg["num_hidden_layers"] * (3 if ckpt else 2)
    if off_param:
        micro += 2 * params * (3 if ckpt else 2) / gpus / PCIE_BYTES_PER_S
    opt = 0.05
    if off_opt:
        opt += trainable / gpus / CPU_ADAM_PARAMS_PER_S + 8 * trainable / gpus / PCIE_BYTES_PER_S
    step = micro * tr["gradient_accumulation_steps"] + opt
    total = STARTUP_S + init + (2 + measured_steps) * step
    return round(float(SAFETY * total), 1)


def _offload_tag(opt: bool, param: bool) -> str:
    return "opt+param" if param else ("opt" if opt else "none")


_ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
_EVERY_PROJECTION = (*_ATTENTION_TARGETS, "gate_proj", "up_proj", "down_proj")


def make_case(model: str, method: str, stage: int, offload: str, ckpt: bool, seq: int, mb: int,
              ga: int, gpus: int = 1, *, group: str = "rest", steps: int = 3,
              expect: str = "ok", targets: tuple[str, ...] = _ATTENTION_TARGETS, rank: int = 16) -> Case:
    """One case; ``offload`` is none | opt | opt+param (the last only with stage 3); LoRA adapts
    ``targets`` (other than q/k/v/o, they end the case's name: ``|t=qkv.o``) at rank ``rank`` (other
    than 16, it ends the name too: ``|r=64``)."""
    off_opt, off_param = offload in ("opt", "opt+param"), offload == "opt+param"
    if off_param and stage != 3:
        raise ValueError("parameter offload needs ZeRO-3")
    name = "|".join([model, method, f"z{stage}", f"off={_offload_tag(off_opt, off_param)}",
                     "ckpt" if ckpt else "nockpt", f"s{seq}", f"mb{mb}", f"g{ga}"])
    if gpus > 1:
        name += f"|gpus{gpus}"
    if targets != _ATTENTION_TARGETS:
        name += "|t=" + ".".join(t.removesuffix("_proj") for t in targets)
    if rank != 16:
        name += f"|r={rank}"
    spec: dict[str, Any] = {
        "name": name,
        "model": {"config": copy.deepcopy(MODELS[model])},
        "method": method,
        "lora": {"r": rank, "alpha": 2 * rank, "dropout": 0.05,
                 "target_modules": list(targets)},
        "training": {"max_steps": 2 + steps, "epochs": None, "micro_batch_size": mb,
                     "gradient_accumulation_steps": ga, "seq_len": seq,
                     "gradient_checkpointing": ckpt, "precision": "bf16", "optimizer": "adamw",
                     "learning_rate": 1e-4, "weight_decay": 0.0},
        "resources": {"num_gpus": gpus, "zero_stage": stage,
                      "offload_optimizer": "cpu" if off_opt else "none",
                      "offload_param": "cpu" if off_param else "none",
                      "deepspeed": zero_knobs(stage)},
        "hardware": {"gpu_count": gpus, "gpu_memory_bytes": H200_MEMORY_BYTES,
                     "host_memory_bytes": HOST_MEMORY_PER_GPU_BYTES * gpus, "gpu_name": "NVIDIA H200"},
    }
    return Case(name=name, spec=spec, est_seconds=estimate_seconds(spec, steps), measured_steps=steps,
                group=group, expect=expect)


def _core() -> list[Case]:
    c = "core"
    return [
        make_case("qwen2.5-0.5b", "full", 3, "none", True, 1024, 2, 1, group=c),
        make_case("qwen2.5-0.5b", "full", 0, "none", True, 1024, 2, 1, group=c),
        make_case("qwen2.5-0.5b", "full", 2, "none", True, 1024, 2, 1, group=c),
        make_case("qwen2.5-0.5b", "full", 3, "none", False, 1024, 2, 1, group=c),
        make_case("qwen2.5-0.5b", "lora", 3, "none", True, 1024, 2, 1, group=c),
        make_case("qwen2.5-0.5b", "full", 3, "opt", True, 1024, 2, 1, group=c),
        make_case("qwen2.5-0.5b", "full", 3, "opt+param", True, 1024, 2, 1, group=c, steps=2),
        make_case("qwen2.5-0.5b", "full", 2, "opt", True, 1024, 2, 1, group=c),
        make_case("qwen2.5-0.5b", "full", 3, "none", True, 4096, 1, 2, group=c),
        make_case("llama-3.2-1b", "full", 2, "none", False, 1024, 4, 1, group=c),
        make_case("qwen2.5-1.5b", "full", 3, "none", True, 2048, 2, 1, group=c),
        make_case("qwen2.5-1.5b", "lora", 0, "none", False, 2048, 1, 1, group=c),
        make_case("qwen2.5-3b", "lora", 3, "none", True, 2048, 2, 1, group=c),
        make_case("qwen2.5-3b", "full", 3, "opt", True, 1024, 1, 1, group=c, steps=2),
    ]


def _rest() -> list[Case]:
    # Most informative first: a second run that cannot finish them all still covers the big models
    # and both GPU counts.
    return [
        # Deliberately too large for one GPU: shows that the OOM path records status "oom".
        make_case("qwen2.5-7b", "full", 0, "none", False, 4096, 4, 1, steps=1, expect="oom"),
        make_case("qwen2.5-7b", "lora", 3, "none", True, 2048, 2, 1),
        make_case("qwen2.5-0.5b", "full", 3, "none", True, 1024, 2, 1, gpus=2),
        make_case("qwen2.5-7b", "full", 3, "none", True, 2048, 1, 1, gpus=2),
        make_case("qwen2.5-3b", "full", 2, "none", True, 2048, 2, 1),
        make_case("qwen2.5-1.5b", "full", 3, "none", False, 4096, 1, 1),
        make_case("qwen2.5-7b", "lora", 0, "none", True, 1024, 2, 1),
        make_case("qwen2.5-1.5b", "full", 2, "none", True, 2048, 2, 1, gpus=2),
        make_case("qwen2.5-3b", "full", 3, "opt", True, 1024, 1, 1, gpus=2, steps=2),
        make_case("llama-3.2-1b", "lora", 3, "none", False, 4096, 2, 1),
        make_case("llama-3.2-1b", "full", 3, "none", True, 512, 4, 4),
        make_case("qwen2.5-0.5b", "full", 0, "none", False, 512, 4, 1),
        make_case("qwen2.5-7b", "lora", 3, "none", True, 2048, 2, 1, gpus=2),
        make_case("qwen2.5-1.5b", "full", 2, "opt", False, 1024, 2, 1),
        make_case("qwen2.5-7b", "lora", 3, "opt+param", True, 1024, 1, 1, steps=2),
        make_case("qwen2.5-3b", "full", 3, "opt+param", True, 1024, 1, 1, steps=2),
        # 7B optimizer states (~122 GB fp32 on the host) only fit the 2-GPU host's 256 GiB.
        make_case("qwen2.5-7b", "full", 3, "opt", True, 1024, 1, 1, gpus=2, steps=2),
    ]


def _heldout() -> list[Case]:
    """Configurations none of the calibrated constants was fitted on: other families (Mistral, Phi-3,
    Gemma 2, Llama 3.2 3B), ZeRO-1, sequences of 8192, micro-batch 4 with parameter offload,
    accumulation with offload, and offload across two GPUs. Their records go to their own results
    file, which ``bench/accuracy.py`` reports as held-out."""
    h = "heldout"
    return [
        make_case("mistral-7b-v0.3", "lora", 3, "none", True, 4096, 2, 1, group=h),
        make_case("llama-3.2-3b", "full", 3, "opt", True, 2048, 2, 1, gpus=2, group=h),
        make_case("phi-3-mini", "full", 2, "none", True, 2048, 2, 1, group=h),
        make_case("qwen2.5-1.5b", "full", 1, "none", True, 2048, 2, 1, gpus=2, group=h),
        make_case("gemma-2-2b", "lora", 3, "none", True, 2048, 2, 1, group=h),
        make_case("qwen2.5-0.5b", "lora", 2, "none", False, 8192, 1, 1, group=h),
        make_case("llama-3.2-1b", "full", 3, "opt+param", False, 2048, 4, 1, group=h, steps=2),
        make_case("qwen2.5-3b", "lora", 3, "opt+param", True, 8192, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-1.5b", "full", 3, "none", True, 1024, 4, 2, gpus=2, group=h),
        make_case("qwen2.5-7b", "lora", 2, "none", True, 4096, 1, 1, gpus=2, group=h),
        make_case("qwen2.5-0.5b", "full", 2, "opt", False, 4096, 1, 4, group=h),
    ]


def _heldout3() -> list[Case]:
    """A third set none of the constants saw: Llama 3.1 8B, accumulation and parameter offload on two
    GPUs (the shapes whose allocator slack the second held-out set under-estimated), full
    fine-tuning of a 256k-vocabulary model on two GPUs, LoRA with accumulation under ZeRO-2,
    ZeRO-0 LoRA at seq 4096, two GPUs without checkpointing."""
    h = "heldout3"
    return [
        make_case("qwen2.5-1.5b", "full", 3, "none", True, 2048, 2, 2, gpus=2, group=h),
        make_case("llama-3.2-1b", "lora", 3, "opt+param", True, 4096, 2, 1, gpus=2, group=h, steps=2),
        make_case("llama-3.1-8b", "lora", 3, "none", True, 2048, 4, 1, group=h),
        make_case("gemma-2-2b", "full", 3, "none", True, 1024, 2, 1, gpus=2, group=h),
        make_case("qwen2.5-3b", "lora", 2, "none", False, 2048, 2, 2, group=h),
        make_case("qwen2.5-0.5b", "full", 3, "opt+param", True, 2048, 2, 1, gpus=2, group=h, steps=2),
        make_case("llama-3.2-3b", "lora", 0, "none", True, 4096, 2, 1, group=h),
        make_case("phi-3-mini", "full", 3, "none", False, 1024, 2, 1, gpus=2, group=h),
    ]


def _heldout4() -> list[Case]:
    """Two unseen configurations for the three-term allocator slack: ZeRO-3 on two GPUs with
    accumulation (Qwen2.5-3B full) and without (Mistral 7B LoRA)."""
    h = "heldout4"
    return [
        make_case("qwen2.5-3b", "full", 3, "none", True, 1024, 2, 2, gpus=2, group=h),
        make_case("mistral-7b-v0.3", "lora", 3, "none", True, 2048, 1, 2, gpus=2, group=h),
    ]


def _heldout5() -> list[Case]:
    """Eight more unseen configurations, run with PyTorch's allocator limited to the plan as the
    service runs it: mostly ZeRO-3 on two GPUs (full 7B, 3B without checkpointing, LoRA at 4096,
    LoRA with optimizer offload, Phi-3 with optimizer offload and accumulation, Llama 3.1 8B LoRA),
    ZeRO-2 LoRA of Mistral 7B and a one-GPU ZeRO-3 full fine-tune without checkpointing."""
    h = "heldout5"
    return [
        make_case("qwen2.5-7b", "full", 3, "none", True, 1024, 2, 2, gpus=2, group=h),
        make_case("llama-3.2-3b", "full", 3, "none", False, 2048, 1, 2, gpus=2, group=h),
        make_case("qwen2.5-1.5b", "lora", 3, "none", True, 4096, 2, 1, gpus=2, group=h),
        make_case("gemma-2-2b", "lora", 3, "opt", True, 2048, 2, 1, gpus=2, group=h),
        make_case("phi-3-mini", "full", 3, "opt", True, 2048, 1, 2, gpus=2, group=h, steps=2),
        make_case("llama-3.1-8b", "lora", 3, "none", True, 4096, 1, 1, gpus=2, group=h),
        make_case("mistral-7b-v0.3", "lora", 2, "none", True, 2048, 2, 1, group=h),
        make_case("qwen2.5-3b", "full", 3, "none", False, 1024, 1, 1, group=h),
    ]


def _heldout6() -> list[Case]:
    """Six more unseen configurations: LoRA with optimizer offload on two GPUs, ZeRO-2 full
    fine-tuning with optimizer offload, full Mistral 7B on two GPUs, ZeRO-1 on two GPUs, a one-GPU
    Gemma 2 without checkpointing and a small LoRA at seq 4096 with micro-batch 4."""
    h = "heldout6"
    return [
        make_case("qwen2.5-7b", "lora", 3, "opt", True, 4096, 1, 1, gpus=2, group=h),
        make_case("llama-3.2-3b", "full", 2, "opt", True, 2048, 2, 1, group=h, steps=2),
        make_case("mistral-7b-v0.3", "full", 3, "none", True, 1024, 1, 1, gpus=2, group=h),
        make_case("llama-3.2-1b", "full", 1, "none", False, 1024, 2, 2, gpus=2, group=h),
        make_case("gemma-2-2b", "full", 3, "none", False, 1024, 1, 2, group=h),
        make_case("qwen2.5-0.5b", "lora", 0, "none", True, 4096, 4, 1, group=h),
    ]


def _heldout7() -> list[Case]:
    """Seven unseen configurations for the four-term allocator slack and the host model: ZeRO-3
    with accumulation on two GPUs (1.5B and 7B full), LoRA with 16k tokens per micro-batch over
    128k and 256k vocabularies, ZeRO-2 with optimizer offload of a partition larger than a bucket,
    Mistral 7B LoRA with parameter offload on two GPUs, and ZeRO-3 optimizer offload on one GPU."""
    h = "heldout7"
    return [
        make_case("qwen2.5-1.5b", "full", 3, "none", True, 1024, 2, 2, gpus=2, group=h),
        make_case("llama-3.2-1b", "lora", 2, "none", True, 8192, 2, 1, group=h),
        make_case("gemma-2-2b", "lora", 0, "none", True, 2048, 4, 1, group=h),
        make_case("qwen2.5-3b", "full", 2, "opt", True, 2048, 1, 1, group=h, steps=2),
        make_case("mistral-7b-v0.3", "lora", 3, "opt+param", True, 2048, 1, 1, gpus=2, group=h, steps=2),
        make_case("llama-3.2-3b", "full", 3, "opt", True, 1024, 2, 1, group=h, steps=2),
        make_case("qwen2.5-7b", "full", 3, "none", True, 2048, 1, 2, gpus=2, group=h),
    ]


def _heldout8() -> list[Case]:
    """Unseen configurations for the allocated-peak paths read off DeepSpeed's code: ZeRO-0 and
    ZeRO-1 with accumulation (gradients and ZeRO-1's buckets held into the next micro-step), ZeRO-2
    with optimizer offload of untied models and with accumulation (the offloaded gradient's fp64
    norm), ZeRO-3 optimizer offload on one GPU, full fine-tuning of a soft-capped Gemma 2, and the
    two shapes whose allocated peak is still missed (Phi-3 ZeRO-3 offload on two GPUs, LoRA with
    parameter offload on two GPUs)."""
    h = "heldout8"
    return [
        make_case("qwen2.5-1.5b", "full", 0, "none", False, 1024, 2, 2, group=h),
        make_case("llama-3.2-3b", "full", 1, "none", False, 1024, 2, 2, gpus=2, group=h),
        make_case("qwen2.5-1.5b", "full", 1, "none", True, 2048, 1, 4, gpus=2, group=h),
        make_case("phi-3-mini", "full", 2, "opt", True, 2048, 1, 1, group=h, steps=2),
        make_case("qwen2.5-1.5b", "full", 2, "opt", True, 2048, 2, 2, group=h, steps=2),
        make_case("qwen2.5-1.5b", "full", 3, "opt", True, 2048, 1, 1, group=h, steps=2),
        make_case("gemma-2-2b", "full", 2, "none", True, 2048, 1, 1, group=h),
        make_case("phi-3-mini", "full", 3, "opt", True, 1024, 2, 1, gpus=2, group=h, steps=2),
        make_case("llama-3.1-8b", "lora", 3, "opt+param", True, 2048, 1, 1, gpus=2, group=h, steps=2),
    ]


def _heldout9() -> list[Case]:
    """Unseen configurations for what ZeRO-1/2 initialisation leaves cached (the model's blocks,
    the flat copy, the partition's clone) and the fp64 norm blocks of optimizer offload: untied
    and tied heads, a 256k vocabulary, ZeRO-1 offload with accumulation, two GPUs; and LoRA with
    ZeRO-3 parameter offload over a 152k vocabulary, whose slack the other records split on."""
    h = "heldout9"
    return [
        make_case("llama-3.2-1b", "full", 2, "opt", True, 2048, 1, 1, group=h, steps=2),
        make_case("gemma-2-2b", "full", 2, "opt", True, 2048, 1, 1, group=h, steps=2),
        make_case("llama-3.2-3b", "full", 1, "opt", True, 1024, 2, 2, group=h, steps=2),
        make_case("phi-3-mini", "full", 2, "opt", True, 1024, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-7b", "lora", 3, "opt+param", True, 2048, 1, 1, gpus=2, group=h, steps=2),
    ]


def _heldout10() -> list[Case]:
    """Models no record has (Gemma 2 9B, Gemma 7B, Qwen2.5-14B, Llama 3 8B, Mistral 7B v0.1) in
    the shapes a team runs most: LoRA on one or two GPUs, full fine-tuning under ZeRO-3 across two
    GPUs and with optimizer offload; plus ZeRO-1/2 of smaller models at shapes not measured."""
    h = "heldout10"
    return [
        make_case("gemma-2-9b", "lora", 3, "none", True, 2048, 2, 1, group=h),
        make_case("qwen2.5-14b", "lora", 2, "none", True, 2048, 1, 1, gpus=2, group=h),
        make_case("gemma-7b", "full", 3, "none", True, 1024, 1, 1, gpus=2, group=h, steps=2),
        make_case("llama-3-8b", "full", 3, "opt", True, 2048, 1, 1, gpus=2, group=h, steps=2),
        make_case("mistral-7b-v0.1", "lora", 3, "opt+param", True, 4096, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-3b", "full", 1, "none", False, 1024, 2, 2, gpus=2, group=h),
        make_case("llama-3.2-3b", "full", 2, "opt", True, 4096, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-1.5b", "full", 0, "none", True, 1024, 4, 1, group=h),
        make_case("gemma-2-9b", "full", 3, "opt", True, 1024, 1, 1, gpus=2, group=h, steps=2),
    ]


def _heldout11() -> list[Case]:
    """Unseen configurations for the slack's fetch terms (the gathered embedding's and head's
    blocks over 256k, 152k, 128k and 32k vocabularies, LoRA and full fine-tuning on two GPUs) and
    its largest-gradient term with the optimizer offloaded (ZeRO-1/2/3)."""
    h = "heldout11"
    return [
        make_case("gemma-2-9b", "lora", 3, "opt+param", True, 2048, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-14b", "lora", 3, "none", True, 2048, 2, 1, gpus=2, group=h),
        make_case("llama-3-8b", "lora", 3, "opt", True, 4096, 1, 1, gpus=2, group=h, steps=2),
        make_case("llama-3.2-3b", "lora", 3, "opt+param", True, 4096, 2, 1, gpus=2, group=h, steps=2),
        make_case("mistral-7b-v0.1", "full", 3, "none", True, 2048, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-7b", "full", 2, "opt", True, 2048, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-0.5b", "full", 1, "opt", False, 2048, 2, 1, group=h, steps=2),
    ]


def _heldout12() -> list[Case]:
    """Unseen configurations, small enough for the end of a device session, for the planner with
    the host-clock factor: LoRA with ZeRO-3 parameter offload (the step-time shape the plan misses
    most), LoRA under ZeRO-3 on two GPUs over a 256k vocabulary, ZeRO-0 LoRA, ZeRO-1 and ZeRO-2
    full fine-tuning."""
    h = "heldout12"
    return [
        make_case("qwen2.5-1.5b", "lora", 3, "opt+param", True, 2048, 2, 1, gpus=2, group=h, steps=2),
        make_case("gemma-2-2b", "lora", 3, "none", True, 2048, 1, 1, gpus=2, group=h),
        make_case("llama-3.2-1b", "full", 2, "none", True, 4096, 2, 1, group=h),
        make_case("qwen2.5-3b", "lora", 0, "none", False, 2048, 4, 1, group=h),
        make_case("phi-3-mini", "full", 1, "none", True, 1024, 1, 2, gpus=2, group=h),
    ]


def _heldout13() -> list[Case]:
    """Unseen configurations where the planner has erred most: full fine-tuning with optimizer
    offload of a 152k-vocabulary model on two GPUs, LoRA with parameter offload of a 128k one,
    ZeRO-1 without checkpointing on one and two GPUs, ZeRO-2 offload of a 7B model on two GPUs,
    Qwen2.5-14B LoRA with optimizer offload, ZeRO-0 LoRA at 8k tokens per micro-batch."""
    h = "heldout13"
    return [
        make_case("qwen2.5-7b", "full", 3, "opt", True, 2048, 2, 1, gpus=2, group=h, steps=2),
        make_case("llama-3.1-8b", "lora", 3, "opt+param", True, 4096, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-1.5b", "full", 1, "none", False, 2048, 1, 2, gpus=2, group=h),
        make_case("llama-3.2-3b", "full", 1, "none", False, 1024, 1, 1, group=h),
        make_case("mistral-7b-v0.3", "full", 2, "opt", True, 1024, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-14b", "lora", 3, "opt", True, 2048, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-7b", "lora", 0, "none", True, 4096, 2, 1, group=h),
        make_case("gemma-2-2b", "full", 1, "opt", False, 1024, 2, 1, group=h, steps=2),
    ]


def _heldout14() -> list[Case]:
    """Unseen configurations for the slack's per-method fetch term: full fine-tuning under ZeRO-3
    on two GPUs over 128k and 152k vocabularies (with and without optimizer offload), LoRA under
    ZeRO-3 on two GPUs over 256k, 152k and 32k vocabularies (with parameter or optimizer offload or
    none), and ZeRO-2 and single-GPU ZeRO-3 full fine-tuning."""
    h = "heldout14"
    return [
        make_case("llama-3.1-8b", "full", 3, "none", True, 1024, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-3b", "full", 3, "opt", True, 2048, 2, 1, gpus=2, group=h, steps=2),
        make_case("gemma-2-2b", "lora", 3, "opt+param", True, 4096, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-7b", "lora", 3, "none", True, 4096, 2, 1, gpus=2, group=h),
        make_case("llama-3.2-3b", "full", 3, "none", True, 1024, 2, 1, gpus=2, group=h),
        make_case("mistral-7b-v0.3", "lora", 3, "opt", True, 4096, 1, 1, gpus=2, group=h, steps=2),
        make_case("qwen2.5-1.5b", "full", 2, "none", True, 2048, 4, 1, group=h),
        make_case("phi-3-mini", "full", 3, "none", True, 2048, 1, 1, group=h),
    ]


def _heldout15() -> list[Case]:
    """Unseen configurations for the planner fitted on 119 records with the tied LM head's pinned
    block: parameter offload of a tied model, ZeRO-3 LoRA on one GPU, full fine-tuning with
    optimizer offload of a 32k-vocabulary model on two GPUs, ZeRO-0 without checkpointing, ZeRO-2
    of Gemma 2 and of LoRA on two GPUs."""
    h = "heldout15"
    return [
        make_case("mistral-7b-v0.3", "full", 3, "opt", True, 2048, 1, 1, gpus=2, group=h, steps=2),
        make_case("llama-3.1-8b", "lora", 3, "none", True, 4096, 2, 1, group=h),
        make_case("qwen2.5-0.5b", "lora", 3, "opt+param", True, 2048, 4, 1, gpus=2, group=h, steps=2),
        make_case("gemma-2-2b", "full", 2, "none", True, 1024, 2, 1, group=h),
        make_case("llama-3.2-1b", "full", 0, "none", False, 2048, 2, 1, group=h),
        make_case("qwen2.5-3b", "lora", 2, "none", True, 4096, 2, 1, gpus=2, group=h),
    ]


def _repeats() -> list[Case]:
    """Configurations measured before, run again (twice in one device session) to show how far
    the same configuration's peak and step time move between runs and between sessions: the
    under-estimate ZeRO-1 and ZeRO-3 shapes that bind the slack fit, the most over-estimated
    small job, the step time missed most, and a shape measured in two earlier sessions."""
    r = "repeat"
    return [
        make_case("qwen2.5-3b", "full", 1, "none", False, 1024, 2, 2, gpus=2, group=r),
        make_case("mistral-7b-v0.1", "full", 3, "none", True, 2048, 1, 1, gpus=2, group=r, steps=2),
        make_case("qwen2.5-7b", "lora", 3, "opt+param", True, 2048, 1, 1, gpus=2, group=r, steps=2),
        make_case("qwen2.5-1.5b", "full", 3, "none", True, 2048, 2, 2, gpus=2, group=r),
        make_case("qwen2.5-0.5b", "full", 0, "none", False, 512, 4, 1, group=r),
    ]


def _heldout16() -> list[Case]:
    """Unseen configurations measured over ten steps each, with where each step's time goes
    (``measured.phase_seconds``): LoRA with ZeRO-3 parameter offload on two GPUs (the step time the
    planner misses most), ZeRO-3 LoRA and full fine-tuning on two GPUs, ZeRO-1 and ZeRO-2 of full
    fine-tuning on two GPUs, ZeRO-0 LoRA without checkpointing."""
    h = "heldout16"
    return [
        make_case("llama-3.2-3b", "lora", 3, "opt+param", True, 2048, 1, 1, gpus=2, group=h, steps=10),
        make_case("llama-3.2-1b", "lora", 3, "opt+param", True, 1024, 4, 1, gpus=2, group=h, steps=10),
        make_case("qwen2.5-3b", "lora", 3, "none", True, 2048, 2, 1, gpus=2, group=h, steps=10),
        make_case("qwen2.5-7b", "full", 3, "none", True, 1024, 2, 1, gpus=2, group=h, steps=10),
        make_case("qwen2.5-1.5b", "full", 2, "none", True, 1024, 4, 1, gpus=2, group=h, steps=10),
        make_case("llama-3.2-1b", "full", 1, "none", False, 1024, 4, 2, gpus=2, group=h, steps=10),
        make_case("gemma-2-2b", "lora", 0, "none", False, 1024, 4, 1, group=h, steps=10),
    ]


def _steady() -> list[Case]:
    """Configurations measured before over two or three steps, whose step times moved by up to 82%
    from one step to the next, measured again over ten: the step times the planner missed most in
    either direction (LoRA with ZeRO-3 parameter offload on two GPUs, ZeRO-2 LoRA on two GPUs,
    small jobs, the CPU optimizer of ZeRO-1), and GPU-bound shapes beside them."""
    g = "steady"
    return [
        make_case("gemma-2-2b", "lora", 3, "opt+param", True, 4096, 1, 1, gpus=2, group=g, steps=10),
        make_case("qwen2.5-0.5b", "lora", 3, "opt+param", True, 2048, 4, 1, gpus=2, group=g, steps=10),
        make_case("qwen2.5-7b", "lora", 3, "opt+param", True, 2048, 1, 1, gpus=2, group=g, steps=10),
        make_case("qwen2.5-3b", "lora", 2, "none", True, 4096, 2, 1, gpus=2, group=g, steps=10),
        make_case("qwen2.5-3b", "full", 1, "none", False, 1024, 2, 2, gpus=2, group=g, steps=10),
        make_case("mistral-7b-v0.1", "full", 3, "none", True, 2048, 1, 1, gpus=2, group=g, steps=10),
        make_case("qwen2.5-0.5b", "full", 0, "none", False, 512, 4, 1, group=g, steps=10),
        make_case("gemma-2-2b", "lora", 3, "none", True, 2048, 2, 1, group=g, steps=10),
        make_case("mistral-7b-v0.3", "lora", 3, "none", True, 4096, 2, 1, group=g, steps=10),
        make_case("llama-3.2-3b", "full", 1, "opt", True, 1024, 2, 2, group=g, steps=10),
        make_case("llama-3.2-1b", "full", 3, "opt+param", False, 2048, 4, 1, group=g, steps=10),
        make_case("qwen2.5-1.5b", "full", 0, "none", False, 1024, 2, 2, group=g, steps=10),
        make_case("llama-3.1-8b", "lora", 3, "none", True, 4096, 2, 1, group=g, steps=10),
        make_case("gemma-2-2b", "full", 2, "none", True, 1024, 2, 1, group=g, steps=10),
        make_case("qwen2.5-7b", "lora", 0, "none", True, 4096, 2, 1, group=g, steps=10),
    ]


def _logits() -> list[Case]:
    """LoRA without gradient checkpointing, where the vocabulary-sized blocks of the loss are most
    of what the step allocates besides the weights: Gemma 2 2B (soft-capped logits over a 256k
    vocabulary) at ZeRO-0 micro-batch 4, sequence 1024 cached 6.3 GiB above its allocated peak
    against 2.9 GiB for Qwen2.5-3B at twice the tokens. The same Gemma configuration again, without
    soft-capping, at other shapes and ZeRO stages and with checkpointing, and models without
    soft-capping at logits of the same size: which of them cache the extra block."""
    g = "logits"
    return [
        make_case("gemma-2-2b", "lora", 0, "none", False, 1024, 4, 1, group=g, steps=4),
        make_case("gemma-2-2b-nosoftcap", "lora", 0, "none", False, 1024, 4, 1, group=g, steps=4),
        make_case("gemma-2-2b", "lora", 0, "none", False, 1024, 2, 1, group=g, steps=4),
        make_case("gemma-2-2b", "lora", 0, "none", False, 2048, 2, 1, group=g, steps=4),
        make_case("gemma-2-2b", "lora", 0, "none", False, 512, 4, 1, group=g, steps=4),
        make_case("gemma-2-2b", "lora", 2, "none", False, 1024, 4, 1, group=g, steps=4),
        make_case("gemma-2-2b", "lora", 3, "none", False, 1024, 4, 1, group=g, steps=4),
        make_case("gemma-2-2b", "lora", 0, "none", True, 1024, 4, 1, group=g, steps=4),
        make_case("llama-3.2-1b", "lora", 0, "none", False, 2048, 4, 1, group=g, steps=4),
        make_case("qwen2.5-1.5b", "lora", 0, "none", False, 2048, 4, 1, group=g, steps=4),
        make_case("gemma-2-9b", "lora", 0, "none", False, 1024, 2, 1, group=g, steps=4),
    ]


def _heldout17() -> list[Case]:
    """Unseen soft-capped configurations for the planner whose slack counts the soft-capped loss's
    extra block (the logits matrix): other shapes, ZeRO-1, optimizer offload, full fine-tuning,
    two GPUs, and ZeRO-3, where the block was not seen."""
    h = "heldout17"
    return [
        make_case("gemma-2-2b", "lora", 1, "none", False, 1024, 3, 1, group=h, steps=4),
        make_case("gemma-2-2b", "lora", 0, "none", False, 4096, 1, 1, group=h, steps=4),
        make_case("gemma-2-2b", "lora", 0, "none", False, 1024, 1, 1, group=h, steps=4),
        make_case("gemma-2-9b", "lora", 2, "none", False, 2048, 1, 1, group=h, steps=4),
        make_case("gemma-2-2b", "full", 0, "none", False, 1024, 2, 1, group=h, steps=4),
        make_case("gemma-2-2b", "lora", 2, "opt", False, 1024, 4, 1, group=h, steps=4),
        make_case("gemma-2-2b", "lora", 2, "none", False, 2048, 2, 1, gpus=2, group=h, steps=4),
        make_case("gemma-2-2b", "lora", 3, "none", False, 2048, 2, 1, gpus=2, group=h, steps=4),
        make_case("gemma-2-9b", "lora", 3, "none", False, 1024, 2, 1, group=h, steps=4),
    ]


def _heldout18() -> list[Case]:
    """Unseen configurations for the planner that counts the soft-capped loss's block at every
    ZeRO stage: Gemma 2 9B at 4096 tokens and on two GPUs under ZeRO-3, Gemma 2 2B under ZeRO-3
    at 2048 tokens and at 6144 under ZeRO-1, ZeRO-2 full fine-tuning, and Gemma 7B (a 256k
    vocabulary without soft-capping) beside them."""
    h = "heldout18"
    return [
        make_case("gemma-2-9b", "lora", 0, "none", False, 2048, 2, 1, group=h, steps=4),
        make_case("gemma-2-9b", "lora", 3, "none", False, 1024, 2, 1, gpus=2, group=h, steps=4),
        make_case("gemma-2-2b", "lora", 3, "none", False, 2048, 1, 1, group=h, steps=4),
        make_case("gemma-2-2b", "lora", 1, "none", False, 2048, 3, 1, group=h, steps=4),
        make_case("gemma-2-2b", "full", 2, "none", False, 1024, 2, 1, group=h, steps=4),
        make_case("gemma-7b", "lora", 0, "none", False, 1024, 4, 1, group=h, steps=4),
        make_case("gemma-7b", "lora", 2, "none", False, 2048, 2, 1, group=h, steps=4),
    ]


def _heldout19() -> list[Case]:
    """Unseen configurations over ten steps for the planner with the power mean of the two clocks
    and the optimizer step's walk over the trainable tensors (9e9aa22): LoRA at ZeRO-0 to -3 on
    one and two GPUs whose clocks the plan puts close together, full fine-tuning under ZeRO-2 and
    ZeRO-3 with optimizer offload on two GPUs, and LoRA with optimizer offload."""
    h = "heldout19"
    return [
        make_case("llama-3.2-3b", "lora", 0, "none", False, 1024, 4, 1, group=h, steps=10),
        make_case("qwen2.5-0.5b", "lora", 0, "none", False, 2048, 4, 1, group=h, steps=10),
        make_case("mistral-7b-v0.3", "lora", 2, "none", False, 1024, 2, 1, group=h, steps=10),
        make_case("qwen2.5-3b", "lora", 1, "none", True, 2048, 4, 1, group=h, steps=10),
        make_case("gemma-2-2b", "lora", 1, "none", True, 2048, 2, 1, group=h, steps=10),
        make_case("llama-3.1-8b", "lora", 0, "none", False, 1024, 2, 1, group=h, steps=10),
        make_case("qwen2.5-3b", "full", 2, "none", True, 1024, 2, 1, gpus=2, group=h, steps=10),
        make_case("llama-3.2-1b", "lora", 3, "none", True, 2048, 4, 1, gpus=2, group=h, steps=10),
        make_case("qwen2.5-7b", "lora", 2, "opt", True, 2048, 2, 1, group=h, steps=10),
        make_case("qwen2.5-1.5b", "full", 3, "opt", True, 2048, 2, 1, gpus=2, group=h, steps=10),
    ]


def _heldout20() -> list[Case]:
    """Unseen configurations over ten steps for the planner whose power mean takes in the
    collectives and offload traffic (6257a76): LoRA with ZeRO-3 parameter offload on two GPUs,
    ZeRO-0, -1 and -3 LoRA and ZeRO-2 full fine-tuning on one."""
    h = "heldout20"
    return [
        make_case("qwen2.5-1.5b", "lora", 3, "opt+param", True, 4096, 1, 1, gpus=2, group=h, steps=10),
        make_case("llama-3.2-3b", "lora", 3, "opt+param", True, 1024, 2, 1, gpus=2, group=h, steps=10),
        make_case("mistral-7b-v0.3", "lora", 0, "none", True, 2048, 2, 1, group=h, steps=10),
        make_case("qwen2.5-0.5b", "full", 2, "none", False, 1024, 4, 1, group=h, steps=10),
        make_case("llama-3.2-1b", "lora", 1, "none", False, 1024, 2, 1, group=h, steps=10),
        make_case("qwen2.5-3b", "lora", 3, "none", True, 1024, 4, 1, group=h, steps=10),
    ]


def _heldout21() -> list[Case]:
    """Unseen configurations over ten steps for the planner whose host clock moves by a power of
    the probe and whose offloaded gradients travel in the boundary backward (27b279a): optimizer
    offload with accumulation under ZeRO-1, -2 and -3, full ZeRO-3 with parameter offload on one
    GPU, full ZeRO-2, and LoRA under ZeRO-0, -2 and -3."""
    h = "heldout21"
    return [
        make_case("qwen2.5-1.5b", "full", 2, "opt", True, 1024, 2, 2, group=h, steps=10),
        make_case("llama-3.2-1b", "full", 1, "opt", True, 2048, 2, 2, group=h, steps=10),
        make_case("qwen2.5-0.5b", "full", 3, "opt+param", False, 1024, 4, 1, group=h, steps=10),
        make_case("qwen2.5-3b", "full", 3, "opt", True, 1024, 2, 2, gpus=2, group=h, steps=10),
        make_case("llama-3.2-3b", "lora", 3, "none", True, 2048, 2, 1, gpus=2, group=h, steps=10),
        make_case("gemma-2-2b", "full", 2, "none", True, 2048, 1, 2, group=h, steps=10),
        make_case("qwen2.5-1.5b", "lora", 0, "none", False, 1024, 2, 2, group=h, steps=10),
        make_case("mistral-7b-v0.3", "lora", 3, "opt+param", True, 1024, 2, 1, gpus=2, group=h, steps=10),
        make_case("llama-3.1-8b", "lora", 2, "opt", True, 2048, 2, 1, group=h, steps=10),
    ]


def _heldout22() -> list[Case]:
    """More unseen configurations over ten steps for the same planner (c306528), all on one GPU:
    full fine-tuning under ZeRO-1, -2 and -3 (with optimizer offload for a 3B), LoRA under ZeRO-0,
    -2 and -3 (with optimizer offload for Gemma 2 2B)."""
    h = "heldout22"
    return [
        make_case("llama-3.2-3b", "full", 3, "none", True, 2048, 2, 1, group=h, steps=10),
        make_case("qwen2.5-7b", "lora", 0, "none", True, 2048, 4, 1, group=h, steps=10),
        make_case("phi-3-mini", "full", 2, "none", True, 1024, 2, 2, group=h, steps=10),
        make_case("qwen2.5-0.5b", "lora", 3, "none", False, 4096, 4, 1, group=h, steps=10),
        make_case("qwen2.5-3b", "full", 3, "opt", True, 2048, 2, 1, group=h, steps=10),
        make_case("llama-3.2-1b", "lora", 2, "none", False, 4096, 2, 1, group=h, steps=10),
        make_case("gemma-2-2b", "lora", 3, "opt", True, 1024, 4, 1, group=h, steps=10),
        make_case("qwen2.5-3b", "full", 1, "none", True, 2048, 1, 4, group=h, steps=10),
    ]


def _heldout23() -> list[Case]:
    """Unseen configurations over ten steps for the planner that moves accumulated gradients as
    DeepSpeed does under optimizer offload (ZeRO-1: nothing before the boundary and no host
    buffer; ZeRO-2: the host buffer down, then up and down): ZeRO-1 and ZeRO-2 with optimizer
    offload and accumulation 2-4, and, without offload, full ZeRO-2 and LoRA under ZeRO-3 with
    accumulation, all on one GPU."""
    h = "heldout23"
    return [
        make_case("qwen2.5-3b", "full", 1, "opt", True, 1024, 2, 4, group=h, steps=10),
        make_case("phi-3-mini", "full", 1, "opt", True, 2048, 1, 2, group=h, steps=10),
        make_case("llama-3.2-1b", "full", 2, "opt", True, 1024, 2, 4, group=h, steps=10),
        make_case("qwen2.5-3b", "full", 2, "opt", True, 2048, 1, 3, group=h, steps=10),
        make_case("gemma-2-2b", "full", 1, "opt", True, 1024, 2, 2, group=h, steps=10),
        make_case("qwen2.5-0.5b", "full", 2, "opt", False, 1024, 4, 2, group=h, steps=10),
        make_case("llama-3.2-3b", "full", 2, "none", True, 2048, 2, 2, group=h, steps=10),
        make_case("qwen2.5-1.5b", "lora", 3, "none", True, 2048, 2, 2, group=h, steps=10),
    ]


def _heldout24() -> list[Case]:
    """Unseen full fine-tuning under ZeRO-3 with the optimizer and the parameters offloaded, on one
    GPU over ten steps, for the planner whose CPU step there runs at ZeRO-1/2's rate (55d43c8):
    1B to 3B, with and without checkpointing, sequence 1024-4096, accumulation 1-2."""
    h = "heldout24"
    return [
        make_case("llama-3.2-3b", "full", 3, "opt+param", True, 1024, 2, 1, group=h, steps=10),
        make_case("qwen2.5-1.5b", "full", 3, "opt+param", True, 2048, 2, 1, group=h, steps=10),
        make_case("llama-3.2-1b", "full", 3, "opt+param", True, 4096, 1, 1, group=h, steps=10),
        make_case("qwen2.5-3b", "full", 3, "opt+param", False, 1024, 2, 1, group=h, steps=10),
        make_case("gemma-2-2b", "full", 3, "opt+param", True, 2048, 1, 2, group=h, steps=10),
    ]


def _heldout25() -> list[Case]:
    """Unseen configurations over ten steps for the planner whose host clock counts the operations
    and modules a decoder layer runs (planner/ops.py): Qwen3, a family no matrix ran (four norms a
    layer), LoRA on all seven projections and on Phi-3's fused ones, Gemma 2 shapes not measured,
    and LoRA under ZeRO-3, all on one GPU."""
    h = "heldout25"
    return [
        make_case("qwen3-4b", "full", 2, "none", True, 1024, 2, 1, group=h, steps=10),
        make_case("qwen3-4b", "lora", 0, "none", False, 1024, 2, 1, group=h, steps=10),
        make_case("qwen3-4b", "lora", 3, "none", True, 2048, 1, 1, group=h, steps=10),
        make_case("llama-3.2-1b", "lora", 0, "none", False, 1024, 4, 1, group=h, steps=10,
                  targets=_EVERY_PROJECTION),
        make_case("qwen2.5-1.5b", "lora", 2, "none", True, 2048, 2, 1, group=h, steps=10,
                  targets=_EVERY_PROJECTION),
        make_case("phi-3-mini", "lora", 0, "none", False, 2048, 2, 1, group=h, steps=10,
                  targets=("qkv_proj", "o_proj")),
        make_case("gemma-2-2b", "lora", 1, "none", True, 1024, 2, 1, group=h, steps=10),
        make_case("gemma-2-2b", "full", 1, "none", False, 1024, 1, 2, group=h, steps=10),
        make_case("llama-3.2-3b", "lora", 3, "none", False, 1024, 2, 1, group=h, steps=10),
    ]


def _heldout26() -> list[Case]:
    """More unseen configurations for the same planner (operation and module counts), over ten
    steps on one GPU: Qwen3 under ZeRO-3 and with optimizer offload, LoRA on all seven projections
    of 7B-8B models, Phi-3's fused adapters under ZeRO-2, Gemma 2 9B under ZeRO-1."""
    h = "heldout26"
    return [
        make_case("qwen3-4b", "full", 3, "none", True, 2048, 1, 1, group=h, steps=10),
        make_case("qwen3-4b", "full", 2, "opt", True, 1024, 2, 2, group=h, steps=10),
        make_case("qwen3-4b", "lora", 2, "none", True, 4096, 1, 1, group=h, steps=10,
                  targets=_EVERY_PROJECTION),
        make_case("llama-3.1-8b", "lora", 2, "none", True, 2048, 1, 1, group=h, steps=10,
                  targets=_EVERY_PROJECTION),
        make_case("mistral-7b-v0.3", "lora", 0, "none", False, 1024, 2, 1, group=h, steps=10,
                  targets=_EVERY_PROJECTION),
        make_case("phi-3-mini", "lora", 2, "none", True, 1024, 4, 1, group=h, steps=10,
                  targets=("qkv_proj", "o_proj")),
        make_case("phi-3-mini", "lora", 0, "none", False, 1024, 2, 1, group=h, steps=10,
                  targets=("qkv_proj", "o_proj", "gate_up_proj", "down_proj")),
        make_case("gemma-2-9b", "lora", 1, "none", True, 1024, 2, 1, group=h, steps=10),
    ]


def _heldout27() -> list[Case]:
    """Where Gemma 2's soft-capped loss caches one more fp32 logits block under checkpointing: the
    planner says so when ZeRO-1/2's GPU optimizer creates moments at the first step larger than
    every block a layer frees (memory.py's ``_moments_take_a_loss_block``). Cases it says take the
    block (9B under ZeRO-2, 9B at one sequence a micro-batch, 2B at rank 64 and with every
    projection adapted), cases it says do not (9B at rank 8, under ZeRO-0, at twice the tokens),
    and the 2B with its soft-capping switched off at rank 64. One GPU, ten steps, SDPA."""
    h = "heldout27"
    return [
        make_case("gemma-2-9b", "lora", 2, "none", True, 1024, 2, 1, group=h, steps=10),
        make_case("gemma-2-9b", "lora", 1, "none", True, 1024, 1, 1, group=h, steps=10),
        make_case("gemma-2-2b", "lora", 1, "none", True, 1024, 2, 1, group=h, steps=10, rank=64),
        make_case("gemma-2-2b", "lora", 2, "none", True, 1024, 2, 1, group=h, steps=10,
                  targets=_EVERY_PROJECTION),
        make_case("gemma-2-9b", "lora", 1, "none", True, 1024, 2, 1, group=h, steps=10, rank=8),
        make_case("gemma-2-9b", "lora", 0, "none", True, 1024, 2, 1, group=h, steps=10),
        make_case("gemma-2-9b", "lora", 2, "none", True, 2048, 2, 1, group=h, steps=10),
        make_case("gemma-2-2b-nosoftcap", "lora", 1, "none", True, 1024, 2, 1, group=h, steps=10, rank=64),
    ]


def _heldout28() -> list[Case]:
    """Ten unseen configurations across families, methods, ZeRO stages and offload for the planner
    of heldout27 as a whole: one GPU, ten steps."""
    h = "heldout28"
    return [
        make_case("qwen2.5-7b", "lora", 2, "none", True, 4096, 1, 1, group=h, steps=10),
        make_case("llama-3.2-3b", "full", 1, "none", True, 2048, 1, 1, group=h, steps=10),
        make_case("mistral-7b-v0.3", "lora", 3, "none", False, 1024, 2, 1, group=h, steps=10),
        make_case("qwen3-4b", "lora", 1, "none", True, 2048, 2, 1, group=h, steps=10,
                  targets=_EVERY_PROJECTION),
        make_case("gemma-2-2b", "full", 3, "none", True, 2048, 1, 1, group=h, steps=10),
        make_case("llama-3.1-8b", "lora", 0, "none", True, 4096, 1, 1, group=h, steps=10),
        make_case("qwen2.5-1.5b", "full", 2, "none", False, 1024, 2, 2, group=h, steps=10),
        make_case("gemma-2-9b", "lora", 3, "none", True, 2048, 1, 1, group=h, steps=10),
        make_case("qwen2.5-3b", "lora", 2, "opt", True, 2048, 2, 1, group=h, steps=10),
        make_case("qwen2.5-0.5b", "full", 1, "none", True, 4096, 2, 1, group=h, steps=10),
    ]


def _heldout29() -> list[Case]:
    """The loss block the first optimizer step's moments take (memory.py's
    ``_moments_take_a_loss_block``) where heldout28 extended it: ZeRO-3, and an uncapped loss whose
    bf16 logits block cannot hold both moments. Five cases it says take the block (Gemma 2 2B LoRA
    under ZeRO-3, Qwen2.5-0.5B full fine-tuning under ZeRO-1, -2 and -3, Llama 3.2 1B LoRA at rank
    256) and three it says do not (moments larger than the fp32 logits, or fitting together in the
    bf16 block). One GPU, ten steps."""
    h = "heldout29"
    return [
        make_case("gemma-2-2b", "lora", 3, "none", True, 1024, 2, 1, group=h, steps=10, rank=64),
        make_case("qwen2.5-0.5b", "full", 2, "none", True, 4096, 1, 1, group=h, steps=10),
        make_case("qwen2.5-0.5b", "full", 3, "none", True, 4096, 1, 1, group=h, steps=10),
        make_case("llama-3.2-1b", "lora", 1, "none", True, 1024, 2, 1, group=h, steps=10,
                  targets=_EVERY_PROJECTION, rank=256),
        make_case("qwen2.5-0.5b", "full", 1, "none", True, 8192, 1, 1, group=h, steps=10),
        make_case("qwen2.5-0.5b", "full", 1, "none", True, 2048, 1, 1, group=h, steps=10),
        make_case("llama-3.2-3b", "lora", 2, "none", True, 1024, 2, 1, group=h, steps=10,
                  targets=_EVERY_PROJECTION, rank=256),
        make_case("llama-3.2-1b", "lora", 1, "none", True, 1024, 2, 1, group=h, steps=10,
                  targets=_EVERY_PROJECTION, rank=64),
    ]


def _limit_experiment() -> list[Case]:
    """Configurations that cached the most above their allocated peak, from the earlier matrices,
    for runs with PyTorch's allocator held below its natural reserve (``--limit-slack-share``):
    how little slack a limited run needs before it slows down or fails."""
    g = "limit"
    return [
        make_case("qwen2.5-3b", "full", 3, "none", True, 1024, 2, 2, gpus=2, group=g),
        make_case("gemma-2-2b", "full", 3, "none", True, 1024, 2, 1, gpus=2, group=g),
        make_case("qwen2.5-1.5b", "full", 3, "none", True, 2048, 2, 2, gpus=2, group=g),
        make_case("llama-3.2-1b", "lora", 3, "opt+param", True, 4096, 2, 1, gpus=2, group=g, steps=2),
        make_case("phi-3-mini", "full", 2, "none", True, 2048, 2, 1, group=g),
        make_case("qwen2.5-0.5b", "full", 0, "none", False, 512, 4, 1, group=g),
        make_case("qwen2.5-7b", "full", 3, "none", True, 2048, 1, 1, gpus=2, group=g),
    ]


def _with_optimizer(case: Case, optimizer: str) -> Case:
    """``case`` with another optimizer; its name ends ``|o=OPTIMIZER``."""
    spec = copy.deepcopy(case.spec)
    spec["training"]["optimizer"] = optimizer
    spec["name"] = f"{case.name}|o={optimizer}"
    return replace(case, name=spec["name"], spec=spec)


def _unfused_step() -> list[Case]:
    """Full fine-tunes under ZeRO-0 with optimizers other than FusedAdam (DeepSpeed wraps them in
    FP16_UnfusedOptimizer), their peak at the optimizer step: the field cases' SGD and 8-bit AdamW
    jobs, and the SGD one with rows four times as long. Run with ``--alloc-trace`` they show what the
    allocator caches beside that step."""
    g = "unfused"
    return [
        _with_optimizer(make_case("llama-3.2-3b", "full", 0, "none", True, 512, 4, 1, group=g), "sgd"),
        _with_optimizer(make_case("llama-3.2-3b", "full", 0, "none", True, 4096, 2, 1, group=g), "sgd"),
        _with_optimizer(make_case("qwen2.5-1.5b", "full", 0, "none", True, 1024, 4, 1, group=g),
                        "adamw_8bit"),
    ]


def _long_rows() -> list[Case]:
    """LoRA and QLoRA on all projections with many tokens a micro-batch, whose allocator cached more
    above the allocated peak than the plan's slack in the field cases (heldout9's Llama 3.2 3B QLoRA at
    8 x 2048, heldout15's Gemma 2 2B QLoRA at 2 x 4096 under ZeRO-1, heldout16's Gemma 2 2B LoRA at
    16 x 512), and the Llama 3.2 1B SGD job of heldout17 and heldout18 that reserved 0.19 GiB under
    its allocator limit both times, here without one. Run with ``--alloc-trace``."""
    g, every = "long-rows", _EVERY_PROJECTION
    return [
        make_case("llama-3.2-3b", "qlora", 0, "none", True, 2048, 8, 1, group=g, targets=every),
        make_case("gemma-2-2b", "qlora", 1, "none", True, 4096, 2, 1, group=g, targets=every),
        make_case("gemma-2-2b", "lora", 0, "none", True, 512, 16, 1, group=g, targets=every),
        _with_optimizer(make_case("llama-3.2-1b", "full", 0, "none", True, 256, 4, 1, group=g), "sgd"),
    ]


def _zero3_offload_one_gpu() -> list[Case]:
    """Full fine-tunes under ZeRO-3 with the optimizer (and the parameters) offloaded on one GPU, whose
    allocator cached less above the allocated peak than the plan's slack in the field cases
    (heldout8's Qwen2.5-1.5B at 2 x 2048, +11.1%; heldout14's Llama 3.2 1B with both offloads at
    4 x 2048, +12.3%) and in the one-GPU records of this kind, and heldout16's Llama 3.2 3B with both
    offloads at 2 x 4096 (+9.9%), which cached more than those two's structure gives; and heldout7's
    Mistral 7B LoRA with both offloads at 2 x 2048 on every projection (+10.2%), whose adapters'
    gradients fill one bucket. Run with ``--alloc-trace``."""
    g = "z3-offload-one-gpu"
    return [
        make_case("qwen2.5-1.5b", "full", 3, "opt", True, 2048, 2, 1, group=g),
        make_case("llama-3.2-1b", "full", 3, "opt+param", True, 2048, 4, 1, group=g),
        make_case("llama-3.2-3b", "full", 3, "opt+param", True, 4096, 2, 1, group=g),
        make_case("mistral-7b-v0.3", "lora", 3, "opt+param", True, 2048, 2, 1, group=g,
                  targets=_EVERY_PROJECTION),
    ]


def _zero12_slack() -> list[Case]:
    """Full fine-tunes whose allocator cached far less above the allocated peak than the plan's slack
    of their largest gradient: ZeRO-1 with the optimizer offloaded and accumulation (Llama 3.2 3B at
    2 x 1024, accumulation 2, +20.6%), ZeRO-2 without offload (Gemma 2 2B at 2 x 1024, +16.2%) and
    ZeRO-0 without checkpointing (Qwen2.5-0.5B at 4 x 512, +22.4%); and ZeRO-1 with the optimizer
    offloaded and no checkpointing (Qwen2.5-0.5B at 2 x 2048), which cached more than that slack less
    its largest gradient's blocks. Run with ``--alloc-trace``."""
    g = "zero12-slack"
    return [
        make_case("qwen2.5-0.5b", "full", 0, "none", False, 512, 4, 1, group=g),
        make_case("qwen2.5-0.5b", "full", 1, "opt", False, 2048, 2, 1, group=g),
        make_case("llama-3.2-3b", "full", 1, "opt", True, 1024, 2, 2, group=g),
        make_case("gemma-2-2b", "full", 2, "none", True, 1024, 2, 1, group=g),
    ]


CASES: list[Case] = _core() + _rest()
HELDOUT_CASES: list[Case] = _heldout()
HELDOUT3_CASES: list[Case] = _heldout3()
HELDOUT4_CASES: list[Case] = _heldout4()
HELDOUT5_CASES: list[Case] = _heldout5()
HELDOUT6_CASES: list[Case] = _heldout6()
HELDOUT7_CASES: list[Case] = _heldout7()
HELDOUT8_CASES: list[Case] = _heldout8()
HELDOUT9_CASES: list[Case] = _heldout9()
HELDOUT10_CASES: list[Case] = _heldout10()
HELDOUT11_CASES: list[Case] = _heldout11()
HELDOUT12_CASES: list[Case] = _heldout12()
HELDOUT13_CASES: list[Case] = _heldout13()
HELDOUT14_CASES: list[Case] = _heldout14()
HELDOUT15_CASES: list[Case] = _heldout15()
REPEAT_CASES: list[Case] = _repeats()
HELDOUT16_CASES: list[Case] = _heldout16()
STEADY_CASES: list[Case] = _steady()
LOGITS_CASES: list[Case] = _logits()
HELDOUT17_CASES: list[Case] = _heldout17()
HELDOUT18_CASES: list[Case] = _heldout18()
HELDOUT19_CASES: list[Case] = _heldout19()
HELDOUT20_CASES: list[Case] = _heldout20()
HELDOUT21_CASES: list[Case] = _heldout21()
HELDOUT22_CASES: list[Case] = _heldout22()
HELDOUT23_CASES: list[Case] = _heldout23()
HELDOUT24_CASES: list[Case] = _heldout24()
HELDOUT25_CASES: list[Case] = _heldout25()
HELDOUT26_CASES: list[Case] = _heldout26()
HELDOUT27_CASES: list[Case] = _heldout27()
HELDOUT28_CASES: list[Case] = _heldout28()
HELDOUT29_CASES: list[Case] = _heldout29()
MATRICES: dict[str, list[Case]] = {"main": CASES, "heldout": HELDOUT_CASES, "heldout3": HELDOUT3_CASES,
                                   "heldout4": HELDOUT4_CASES, "heldout5": HELDOUT5_CASES,
                                   "heldout6": HELDOUT6_CASES, "heldout7": HELDOUT7_CASES,
                                   "heldout8": HELDOUT8_CASES, "heldout9": HELDOUT9_CASES,
                                   "heldout10": HELDOUT10_CASES, "heldout11": HELDOUT11_CASES,
                                   "heldout12": HELDOUT12_CASES, "heldout13": HELDOUT13_CASES,
                                   "heldout14": HELDOUT14_CASES, "heldout15": HELDOUT15_CASES,
                                   "heldout16": HELDOUT16_CASES, "repeat": REPEAT_CASES,
                                   "steady": STEADY_CASES, "logits": LOGITS_CASES,
                                   "heldout17": HELDOUT17_CASES, "heldout18": HELDOUT18_CASES,
                                   "heldout19": HELDOUT19_CASES, "heldout20": HELDOUT20_CASES,
                                   "heldout21": HELDOUT21_CASES, "heldout22": HELDOUT22_CASES,
                                   "heldout23": HELDOUT23_CASES, "heldout24": HELDOUT24_CASES,
                                   "heldout25": HELDOUT25_CASES, "heldout26": HELDOUT26_CASES,
                                   "heldout27": HELDOUT27_CASES, "heldout28": HELDOUT28_CASES,
                                   "heldout29": HELDOUT29_CASES,
                                   "limit": _limit_experiment(), "unfused": _unfused_step(),
                                   "long-rows": _long_rows(),
                                   "z3-offload-one-gpu": _zero3_offload_one_gpu(),
                                   "zero12-slack": _zero12_slack()}


def by_name() -> dict[str, Case]:
    return {c.name: c for c in CASES}
