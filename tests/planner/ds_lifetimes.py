"""Run by tests/planner/test_deepspeed_lifetimes.py in a process of its own (DeepSpeed on the CPU,
one rank over gloo): trains a tiny Llama a few micro-steps under the installed DeepSpeed and prints,
as one JSON line, which of the buffers the planner's phases count are live after each backward and,
under ZeRO-0 without FusedAdam, at the optimizer's inner step."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": sys.argv[1]}.items():
    os.environ.setdefault(key, value)

import deepspeed  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

BUCKET = 20_000  # elements: far below the model's 0.2M, so buckets fill and flush


def _engine(zero: dict[str, Any], accumulation: int, torch_adam: bool,
            optimizer: dict[str, Any] | None = None) -> tuple[Any, Any]:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": accumulation,
              "optimizer": optimizer or {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": torch_adam}},
              "bf16": {"enabled": True},
              "zero_optimization": {"overlap_comm": True, "contiguous_gradients": True,
                                    "reduce_bucket_size": BUCKET, **zero}}
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    return engine, model


def _backward(engine: Any) -> None:
    ids = torch.randint(0, 512, (2, 16))
    engine.backward(engine(input_ids=ids, labels=ids).loss)


def buckets_and_grads(stage: int) -> list[dict[str, Any]]:
    """ZeRO-1/2 with accumulation 2: the ipg buffers and .grads live after each micro-step's backward."""
    engine, model = _engine({"stage": stage}, accumulation=2, torch_adam=True)
    seen = []
    for _ in range(2):
        _backward(engine)
        buffers = [int(t.numel()) for b in engine.optimizer.ipg_buckets.values() for t in b.buffer]
        seen.append({"buffers": buffers, "grads": sum(p.grad is not None for p in model.parameters()),
                     "params": sum(1 for _ in model.parameters())})
        engine.step()
    return seen


def offloaded_norms(stage: int) -> dict[str, Any]:
    """Optimizer offload: the dtype of the per-parameter gradient norms taken before the copy to the host."""
    zero: dict[str, Any] = {"stage": stage, "offload_optimizer": {"device": "cpu"}}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    engine, model = _engine(zero, accumulation=1, torch_adam=False)
    _backward(engine)
    norms = engine.optimizer.norm_for_param_grads
    return {"dtypes": sorted({str(n.dtype) for n in norms.values()}), "norms": len(norms),
            "params": sum(1 for _ in model.parameters())}


def zero0_step(optimizer: dict[str, Any]) -> dict[str, Any]:
    """ZeRO-0 under bf16 with an optimizer that is not FusedAdam: the wrapper DeepSpeed picks, and
    the gradients live (bf16 on the model, fp32 on the master copies) when the inner step runs."""
    engine, model = _engine({"stage": 0}, accumulation=1, torch_adam=False, optimizer=optimizer)
    wrapper = engine.optimizer
    inner = wrapper.optimizer
    seen: dict[str, Any] = {}
    step = inner.step

    def watched(*args: Any, **kwargs: Any) -> Any:
        masters = [p for group in inner.param_groups for p in group["params"]]
        fp32 = [p.grad for p in masters if p.grad is not None and p.grad.dtype == torch.float32]
        seen.update(fp32_grad_elements=sum(int(g.numel()) for g in fp32),
                    bf16_grad_elements=sum(int(p.grad.numel()) for p in model.parameters()
                                           if p.grad is not None and p.grad.dtype == torch.bfloat16))
        return step(*args, **kwargs)

    inner.step = watched
    _backward(engine)
    engine.step()
    params = sum(int(p.numel()) for p in model.parameters())
    return {"wrapper": type(wrapper).__name__, "params": params, **seen}


def main() -> None:
    from worker._trainlib.extlocks import start_sweeper

    start_sweeper()  # as the trainer does: a build lock a killed run left must not stall this one
    deepspeed.init_distributed(dist_backend="gloo")
    out = {"bucket_elements": BUCKET, "zero1": buckets_and_grads(1), "zero2": buckets_and_grads(2),
           "zero2_offload": offloaded_norms(2), "zero3_offload": offloaded_norms(3),
           "zero0_sgd": zero0_step({"type": "SGD", "params": {"lr": 1e-4, "momentum": 0.9}})}
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
