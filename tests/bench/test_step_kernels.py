"""bench/step_kernels.py: which kernels are memory-bound, a layer's share, the model the trainer builds."""

from __future__ import annotations

import pytest

from bench.step_kernels import attention_for, build, classify, kernel_kind, per_layer


@pytest.mark.parametrize(("name", "kind"), [
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>", "gemm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
    ("fmha_cutlassB_bf16_aligned_64x64_k128_sm80", "attention"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>", "other"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "other"),
    ("Memcpy DtoD (Device -> Device)", "other"),
])
def test_kernels_are_told_apart_by_name(name: str, kind: str) -> None:
    assert kernel_kind(name) == kind


def test_classify_sums_each_kind_and_names_the_costliest_others() -> None:
    out = classify([("nvjet_a", 0.5), ("softmax_fwd", 0.2), ("flash_bwd", 0.1), ("softmax_fwd", 0.3),
                    ("add", 0.05)])
    assert out["gemm_s"] == 0.5 and out["attention_s"] == 0.1
    assert out["other_s"] == pytest.approx(0.55)
    assert out["top_other"][0] == ["softmax_fwd", 0.5]


def test_a_layers_share_is_the_difference_of_the_deep_and_shallow_rows() -> None:
    common = {"model": "m", "method": "lora", "attn": "sdpa", "checkpointing": True, "batch": 1, "seq": 2048}
    rows = [{**common, "layers": 1, "other_s": 5.0}, {**common, "layers": 3, "other_s": 9.0}]
    (row,) = per_layer(rows, "other_s")
    assert row["layer_s"] == 2.0 and row["rest_s"] == 3.0


def test_the_bench_builds_the_model_the_trainer_trains() -> None:
    lora = build("qwen2.5-0.5b", 1, "lora", "sdpa", True, device="cpu")
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert lora.base_model.model.model.gradient_checkpointing
    full = build("qwen2.5-0.5b", 1, "full", "sdpa", False, device="cpu")
    assert all(p.requires_grad for p in full.parameters())
    assert len(full.model.layers) == 1
    # the planner's choice where the job names none: Gemma 2's soft-capped logits need eager attention
    assert attention_for("gemma-2-2b", "auto") == "eager" and attention_for("qwen2.5-0.5b", "auto") == "sdpa"
    assert attention_for("gemma-2-2b", "eager") == "eager"
