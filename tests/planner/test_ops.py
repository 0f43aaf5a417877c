"""The operations a decoder layer dispatches (planner/ops.py) against what PyTorch's dispatcher sees
when the installed transformers runs one (bf16, on the CPU).

A ``TorchDispatchMode`` counts every operation of a forward and of a backward, views and
allocations left out; a model of three layers less one of one layer, halved, is one layer's count,
free of the embedding, the final norm and the loss.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from planner import Setup, arch_from_config, resolve_lora
from planner.facts import model_facts
from planner.ops import layer_modules, layer_ops
from planner.speed import GpuRates, step_terms
from tests.planner.support import TINY_CONFIGS, hf_model

#: Operations that only reshape, alias or allocate: no kernel, next to no host time.
_NOT_COUNTED = frozenset({
    "view", "_unsafe_view", "transpose", "t", "expand", "slice", "select", "unsqueeze", "squeeze",
    "reshape", "as_strided", "detach", "alias", "permute", "split", "split_with_sizes", "chunk",
    "unbind", "lift_fresh", "_reshape_alias", "empty_like", "empty", "empty_strided", "zeros_like",
    "ones_like", "new_empty", "new_empty_strided", "new_zeros", "zeros", "ones", "full",
    "scalar_tensor", "is_same_size", "sym_size", "sym_stride", "sym_numel", "_local_scalar_dense",
    "lift", "arange", "expand_as", "view_as", "narrow",
})

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]

# (tiny config, method, LoRA targets, LoRA dropout, attention)
CASES = [
    ("llama", "full", None, 0.0, "sdpa"),
    ("llama-biases-untied", "full", None, 0.0, "sdpa"),
    ("qwen2", "full", None, 0.0, "sdpa"),
    ("qwen3", "full", None, 0.0, "sdpa"),
    ("mistral", "full", None, 0.0, "sdpa"),
    ("gemma", "full", None, 0.0, "sdpa"),
    ("phi3", "full", None, 0.0, "sdpa"),
    ("llama", "full", None, 0.0, "eager"),
    ("gemma2", "full", None, 0.0, "eager"),
    ("llama", "lora", ATTENTION, 0.05, "sdpa"),
    ("llama", "lora", ATTENTION, 0.0, "sdpa"),
    ("llama", "lora", ALL, 0.05, "sdpa"),
    ("qwen2", "lora", ATTENTION, 0.05, "sdpa"),
    ("phi3", "lora", ["qkv_proj", "o_proj"], 0.05, "sdpa"),
    ("gemma2", "lora", ATTENTION, 0.05, "eager"),
]


def _counted(config: dict[str, Any], layers: int, method: str, targets: list[str] | None,
             dropout: float, attn: str) -> tuple[int, int]:
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter[str] = Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = func.overloadpacket.__name__
            if name not in _NOT_COUNTED:
                self.ops[name] += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = hf_model(dict(config, num_hidden_layers=layers, use_cache=False), dtype=torch.bfloat16,
                     attn_implementation=attn)
    if method == "lora":
        peft = pytest.importorskip("peft")
        lora = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout, target_modules=targets)
        # DeepSpeed's bf16 engine casts the whole module, peft's fp32 adapters included
        model = peft.get_peft_model(model, lora).to(torch.bfloat16)
    model.train()
    ids = torch.randint(0, config["vocab_size"], (1, 16))
    with Count() as forward:
        loss = model(input_ids=ids, labels=ids).loss
    with Count() as backward:
        loss.backward()
    return sum(forward.ops.values()), sum(backward.ops.values())


@pytest.mark.parametrize(("family", "method", "targets", "dropout", "attn"), CASES)
def test_layer_ops_match_the_dispatched_operations(
    family: str, method: str, targets: list[str] | None, dropout: float, attn: str
) -> None:
    config = TINY_CONFIGS[family]
    one = _counted(config, 1, method, targets, dropout, attn)
    three = _counted(config, 3, method, targets, dropout, attn)
    forward, backward = ((b - a) / 2 for a, b in zip(one, three, strict=True))
    arch = arch_from_config(config)
    lora = resolve_lora(arch, 8, targets, dropout) if targets else None
    planned = layer_ops(arch, method, lora, attn)
    assert planned.forward == pytest.approx(forward, rel=0.06), (planned, forward, backward)
    assert planned.backward == pytest.approx(backward, rel=0.06), (planned, forward, backward)


def test_the_host_clock_counts_the_layer_ops_and_a_recomputed_forward() -> None:
    arch = arch_from_config(TINY_CONFIGS["gemma2"])
    lora = resolve_lora(arch, 8, ATTENTION, 0.05)
    facts = model_facts(arch, "lora", lora, "bf16")
    ops = layer_ops(arch, "lora", lora, "eager")
    rates = GpuRates()
    for checkpointing in (False, True):
        s = Setup("lora", 1, 0, "none", "none", 1, 1, 1024, checkpointing, "bf16", "adamw", "eager")
        recomputed = 2 if checkpointing else 1
        expected = arch.num_layers * (recomputed * ops.forward + ops.backward)
        assert step_terms(facts, s, rates).layer_ops == expected


def test_gemma2_layers_dispatch_more_than_llama_layers_of_the_same_shape() -> None:
    """Four norms and soft-capped attention: the reason a Gemma 2 step is more host-bound."""
    llama = layer_ops(arch_from_config(TINY_CONFIGS["llama"]), "full", None, "eager")
    gemma2 = layer_ops(arch_from_config(TINY_CONFIGS["gemma2"]), "full", None, "eager")
    assert gemma2.per_micro_step(False) > 1.4 * llama.per_micro_step(False)
    no_cap = arch_from_config({**TINY_CONFIGS["gemma2"], "attn_logit_softcapping": None})
    assert layer_ops(no_cap, "full", None, "eager").forward < gemma2.forward
    assert layer_ops(no_cap, "full", None, "sdpa").forward < layer_ops(no_cap, "full", None, "eager").forward


@pytest.mark.parametrize(
    ("family", "targets"),
    [("llama", None), ("qwen3", None), ("gemma2", None), ("phi3", None), ("llama", ATTENTION),
     ("gemma2", ALL), ("phi3", ["qkv_proj", "o_proj"])],
)
def test_layer_modules_are_the_modules_a_layer_runs(family: str, targets: list[str] | None) -> None:
    """ZeRO-3 hooks every module; the hooks that cost time are those of the modules a forward calls."""
    torch = pytest.importorskip("torch")
    config = TINY_CONFIGS[family]
    model = hf_model(config, attn_implementation="eager")
    if targets:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_dropout=0.05, target_modules=targets))
    layer = model.get_decoder().layers[0]
    calls: list[str] = []
    for module in layer.modules():
        module.register_forward_pre_hook(lambda m, args: calls.append(type(m).__name__))
    ids = torch.randint(0, config["vocab_size"], (1, 8))
    model(input_ids=ids)
    arch = arch_from_config(TINY_CONFIGS[family])
    lora = resolve_lora(arch, 8, targets, 0.05) if targets else None
    assert layer_modules(arch, lora) == len(calls), sorted(calls)
