"""The GPU-only measurement scripts' parts that run anywhere."""

from __future__ import annotations

import pytest

import planner
from bench import eval_memory, pcie, profile_step
from bench.cases import MODELS


def test_eval_memory_compares_against_the_plans_eval_section_for_the_same_job() -> None:
    figures = eval_memory.planned("qwen2.5-1.5b", 8, 2048, 64)
    spec = {"model": {"config": MODELS["qwen2.5-1.5b"]}, "method": "full",
            "training": {"micro_batch_size": 1, "seq_len": 2048},
            "eval": {"batch_size": 8, "max_new_tokens": 64},
            "hardware": {"gpu_count": 1, "gpu_memory_bytes": 143771 * 2**20,
                         "host_memory_bytes": 512 * 2**30}}
    direct = planner.plan(spec).eval
    assert figures["total_bytes"] == direct.total_bytes and figures["logits_bytes"] == direct.logits_bytes
    assert set(figures) >= {"weights_bytes", "kv_cache_bytes", "logits_bytes", "total_bytes"}


def test_profile_step_needs_a_configuration_and_reads_each_case() -> None:
    with pytest.raises(SystemExit):
        profile_step.main([])
    with pytest.raises(SystemExit):  # an unknown model is refused before anything is built
        profile_step.main(["no-such-model", "lora"])
    plain = ("gemma-2-2b", "full", 1024, 2, True, None)
    assert profile_step._parse_case("gemma-2-2b:full:1024:2:ckpt") == plain
    assert profile_step._parse_case("llama-3.2-3b:lora:2048:1:nockpt:z2")[4:] == (False, 2)


def test_pcie_refuses_a_box_without_a_cuda_gpu() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this box has a CUDA GPU")
    with pytest.raises(SystemExit, match="CUDA"):
        pcie.measure(16)
