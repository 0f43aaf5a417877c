"""``planner.plan``: the interface, "auto" resolution, the ladder, warnings and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planner import HardwareSpec, JobSpec, Plan, PlanError, plan
from planner.speed import SpeedConstants, StepTerms
from tests.planner.support import GIB, H200_BYTES, TINY_CONFIGS, hardware, job


def test_plan_json_has_the_contract_fields() -> None:
    result = plan(job())
    data = result.model_dump(mode="json")
    assert json.loads(json.dumps(data)) == data
    for key in (
        "fits",
        "margin_bytes",
        "num_gpus",
        "resolved",
        "model",
        "per_gpu",
        "host",
        "nvme",
        "eval",
        "estimated_step_seconds",
        "estimated_tokens_per_second",
        "step_time_factor",
        "host_clock_factor",
        "estimated_duration_seconds",
        "deepspeed_config",
        "alternatives",
        "warnings",
        "advice",
    ):
        assert key in data
    for key in (
        "weights_bytes",
        "gradients_bytes",
        "optimizer_states_bytes",
        "activations_bytes",
        "activations_checkpointed_bytes",
        "activations_full_bytes",
        "logits_bytes",
        "zero_buffers_bytes",
        "gathered_parameters_bytes",
        "cuda_context_bytes",
        "allocator_slack_bytes",
        "total_bytes",
        "allocator_limit_bytes",
        "capacity_bytes",
    ):
        assert isinstance(data["per_gpu"][key], int)
    assert Plan.model_validate(data) == result


def test_peak_is_the_larger_phase_plus_slack_and_context() -> None:
    g = plan(job()).per_gpu
    allocated = max(g.forward_backward_bytes, g.optimizer_step_bytes)
    assert g.total_bytes == allocated + g.allocator_slack_bytes + g.cuda_context_bytes
    assert g.required_bytes == g.total_bytes
    # what the worker holds PyTorch's allocator to on a shared card: all but the memory outside it
    assert g.allocator_limit_bytes == g.required_bytes - g.cuda_context_bytes


def test_zero2_offload_peak_can_be_what_initialisation_leaves_cached() -> None:
    """ZeRO-2 with the optimizer offloaded: the model's blocks and the flat copy's partition clone
    stay cached after ``deepspeed.initialize`` and are above the training's own peak; they count
    in what NVML shows but not in what must fit, since an allocator short of memory frees them."""
    spec = job(model={"name": "Qwen/Qwen2.5-3B"}, method="full",
               training={"micro_batch_size": 1, "gradient_accumulation_steps": 1, "seq_len": 2048,
                         "gradient_checkpointing": True},
               resources={"num_gpus": 1, "zero_stage": 2, "offload_optimizer": "cpu",
                          "offload_param": "none"})
    g = plan(spec).per_gpu
    steady = max(g.forward_backward_bytes, g.optimizer_step_bytes) + g.allocator_slack_bytes
    assert g.peak_phase == "initialization"
    assert g.total_bytes > steady + g.cuda_context_bytes
    assert g.initialization_bytes == 2 * g.weights_bytes  # the model beside its flat copy
    assert g.required_bytes == max(steady, g.initialization_bytes) + g.cuda_context_bytes
    assert g.required_bytes < g.total_bytes
    assert g.allocator_limit_bytes == g.required_bytes - g.cuda_context_bytes
    parts = (
        g.weights_bytes
        + g.gradients_bytes
        + g.optimizer_states_bytes
        + g.activations_bytes
        + g.logits_bytes
        + g.zero_buffers_bytes
        + g.gathered_parameters_bytes
    )
    # Each term is at its own peak; they do not all coincide (the logits peak at the loss comes
    # before any gradient or reduction bucket exists), so the phase peak is at most their sum.
    assert g.forward_backward_bytes <= parts
    assert g.forward_backward_bytes >= g.weights_bytes + g.optimizer_states_bytes + g.logits_bytes


def test_spec_model_and_dict_plan_alike() -> None:
    spec = job()
    assert plan(JobSpec.model_validate(spec)) == plan(spec)


def test_hardware_precedence() -> None:
    spec = job()
    del spec["hardware"]
    with pytest.raises(PlanError) as info:
        plan(spec)
    assert info.value.field == "hardware"
    small = HardwareSpec(gpu_count=1, gpu_memory_bytes=24 * GIB, host_memory_bytes=64 * GIB)
    assert plan(spec, hardware=small).per_gpu.capacity_bytes == 24 * GIB
    spec["hardware"] = hardware()
    assert plan(spec, hardware=small).per_gpu.capacity_bytes == H200_BYTES


def test_model_path_is_read_at_call_time(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIGS["llama"]))
    result = plan(job(model={"path": str(tmp_path)}))
    assert result.model.num_parameters > 0
    (tmp_path / "config.json").write_text(json.dumps({**TINY_CONFIGS["llama"], "num_hidden_layers": 0}))
    with pytest.raises(PlanError, match="config.json num_hidden_layers") as bad:
        plan(job(model={"path": str(tmp_path)}))
    assert bad.value.field == "model.path"
    (tmp_path / "config.json").unlink()
    with pytest.raises(PlanError) as info:
        plan(job(model={"path": str(tmp_path)}))
    assert info.value.field == "model.path"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (job(model={"name": "acme/NoSuchModel-7B"}), "model.name"),
        (
            job(model={"config": {**TINY_CONFIGS["llama"], "num_hidden_layers": 0}}),
            "model.config.num_hidden_layers",
        ),
        (job(model={"config": {**TINY_CONFIGS["llama"], "model_type": "bert"}}), "model.config.model_type"),
        (
            job(resources={"num_gpus": 1, "zero_stage": 2, "deepspeed": {"reduce_bucket_sise": 5e8}}),
            "resources.deepspeed.reduce_bucket_sise",
        ),
        (
            job(resources={"deepspeed": {"offload_param": {"buffer_cont": 5}}}),
            "resources.deepspeed.offload_param.buffer_cont",
        ),
        (job(resources={"deepspeed": {"reduce_bucket_size": -1}}), "resources.deepspeed.reduce_bucket_size"),
        (job(lora={"r": 0}), "lora.r"),
        (job(resources={"zero_stage": 2, "offload_param": "cpu"}), "resources.offload_param"),
    ],
)
def test_bad_input_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(PlanError) as info:
        plan(spec)
    assert info.value.field == field


def test_auto_keeps_the_global_batch_and_fills_everything() -> None:
    spec = job(
        training={
            "micro_batch_size": "auto",
            "gradient_accumulation_steps": 16,
            "seq_len": 2048,
            "gradient_checkpointing": "auto",
        },
        resources={},
        hardware=hardware(gpus=4),
    )
    r = plan(spec).resolved
    assert r.micro_batch_size * r.gradient_accumulation_steps * r.num_gpus == 16
    assert r.zero_stage in (0, 1, 2, 3) and r.offload_optimizer in ("none", "cpu", "nvme")


def test_small_gap_is_closed_with_checkpointing_not_offload() -> None:
    # Full fine-tuning of a 1.5B model with long sequences: the states fit, a micro-batch of 8
    # sequences' activations and logits do not.
    spec = job(
        model={"name": "Qwen/Qwen2.5-1.5B"},
        method="full",
        training={
            "micro_batch_size": "auto",
            "gradient_accumulation_steps": 8,
            "seq_len": 4096,
            "gradient_checkpointing": "auto",
        },
        resources={"num_gpus": 1, "zero_stage": 2, "offload_optimizer": "auto", "offload_param": "none"},
        hardware=hardware(gpu_bytes=80 * GIB),
    )
    result = plan(spec)
    assert result.fits
    assert result.resolved.offload_optimizer == "none"
    assert result.resolved.gradient_checkpointing or result.resolved.gradient_accumulation_steps > 1
    offloaded = [a for a in result.alternatives if a.changes.get("resources.offload_optimizer") == "cpu"]
    assert all(a.estimated_step_seconds > result.estimated_step_seconds for a in offloaded)


def test_large_gap_offloads_and_nvme_comes_last() -> None:
    spec = job(
        model={"name": "Qwen/Qwen2.5-7B"},
        method="full",
        training={
            "micro_batch_size": 1,
            "gradient_accumulation_steps": 8,
            "seq_len": 1024,
            "gradient_checkpointing": True,
        },
        resources={"num_gpus": 1},
        hardware=hardware(gpu_bytes=48 * GIB, host_gib=256, nvme_gib=4000),
    )
    result = plan(spec)
    assert result.fits
    assert "cpu" in (result.resolved.offload_optimizer, result.resolved.offload_param)
    assert "nvme" not in (result.resolved.offload_optimizer, result.resolved.offload_param)


def test_explicit_config_that_does_not_fit_says_so_and_offers_the_cheapest_fix() -> None:
    spec = job(
        model={"name": "Qwen/Qwen2.5-7B"},
        method="full",
        training={
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "seq_len": 4096,
            "gradient_checkpointing": False,
        },
        resources={"num_gpus": 2, "zero_stage": 2, "offload_optimizer": "none", "offload_param": "none"},
        hardware=hardware(gpus=8),
    )
    result = plan(spec)
    assert not result.fits and result.margin_bytes < 0
    assert result.resolved.micro_batch_size == 4  # the user's own configuration is what is judged
    first = result.alternatives[0]
    assert first.fits and first.changes
    assert all(a.fits for a in result.alternatives)
    assert not any(key.startswith("resources.offload") for key in first.changes)
    assert any(n.code.startswith("ladder_") for n in result.advice)


def test_fitting_plan_ranks_alternatives_by_speed() -> None:
    spec = job(
        training={"micro_batch_size": "auto", "gradient_accumulation_steps": 8, "seq_len": 1024}, resources={}
    )
    result = plan(spec)
    assert result.fits
    times = [
        a.estimated_step_seconds
        for a in result.alternatives
        if not any(str(v) in ("cpu", "nvme") for v in a.changes.values())
    ]
    assert times == sorted(times)
    assert all(
        a.estimated_step_seconds >= result.estimated_step_seconds * 0.999
        for a in result.alternatives
        if not any(str(v) in ("cpu", "nvme") for v in a.changes.values())
    )


def test_warnings_for_context_precision_and_eval() -> None:
    config = {**TINY_CONFIGS["llama"], "torch_dtype": "float32"}
    spec = job(
        model={"config": config},
        training={"micro_batch_size": 1, "seq_len": 4096, "gradient_checkpointing": True},
        eval={"max_new_tokens": 32768, "batch_size": 1024},
        hardware=hardware(gpu_bytes=8 * GIB),
    )
    codes = {n.code: n.field for n in plan(spec).warnings}
    assert codes["seq_len_beyond_context"] == "training.seq_len"
    assert codes["fp32_weights"] == "model.config.torch_dtype"
    assert codes["eval_memory"] == "eval.max_new_tokens"
    fp32 = job(training={"micro_batch_size": 1, "precision": "fp32", "gradient_checkpointing": True})
    assert "fp32_weights" in {n.code for n in plan(fp32).warnings}


def test_attention_is_what_the_job_asks_for_else_what_transformers_picks() -> None:
    """Gemma 2 without an explicit attention plans eager attention (transformers 5.24 refuses
    SDPA for it) and says so; a job that asks for SDPA plans SDPA, without the seq^2 scores."""
    def gemma(**training: Any) -> Plan:
        return plan(job(model={"config": TINY_CONFIGS["gemma2"]},
                        training={"micro_batch_size": 2, "seq_len": 1024, "gradient_checkpointing": False,
                                  **training}))

    default, sdpa = gemma(), gemma(attn_implementation="sdpa")
    assert default.resolved.attn_implementation == "eager" and sdpa.resolved.attn_implementation == "sdpa"
    assert default.per_gpu.activations_bytes > sdpa.per_gpu.activations_bytes
    assert "gemma2_eager_attention" in {n.code for n in default.warnings}
    assert "gemma2_eager_attention" not in {n.code for n in sdpa.warnings}
    assert plan(job()).resolved.attn_implementation == "sdpa"
    assert plan(job(training={"attn_implementation": "eager"})).resolved.attn_implementation == "eager"
    assert JobSpec.model_validate(job()).training.attn_implementation is None


def test_eval_section_counts_the_kv_cache() -> None:
    short = plan(job(eval={"max_new_tokens": 64, "batch_size": 1})).eval
    long = plan(job(eval={"max_new_tokens": 4096, "batch_size": 8})).eval
    assert long.kv_cache_bytes > 8 * short.kv_cache_bytes
    assert long.total_bytes > short.total_bytes and short.fits


def test_eval_section_counts_the_eval_losss_logits() -> None:
    """The evaluation process's loss holds every position's logits of a batch in the model's dtype
    and upcasts EVAL_LOSS_CHUNK_POSITIONS of them at a time (fp32 and its log-softmax); at long
    sequences over a large vocabulary that outgrows generation's KV cache."""
    from planner import constants as C

    def evaluation(batch: int, seq_len: int, new_tokens: int) -> Any:
        return plan(job(model={"name": "Qwen/Qwen2.5-7B"},
                        eval={"max_new_tokens": new_tokens, "batch_size": batch},
                        training={"micro_batch_size": 1, "seq_len": seq_len})).eval

    vocab, hidden = 152064, 3584  # Qwen2.5-7B
    e = evaluation(8, 2048, 0)
    assert e.logits_bytes == 8 * 2048 * (vocab + hidden) * 2 + 8 * C.EVAL_LOSS_CHUNK_POSITIONS * vocab * 8
    assert e.logits_bytes > 2 * e.kv_cache_bytes
    short = evaluation(8, 128, 0)
    assert short.logits_bytes == 8 * 128 * ((vocab + hidden) * 2 + vocab * 8)  # fewer positions than a chunk
    assert e.total_bytes - short.total_bytes >= e.logits_bytes - short.logits_bytes
    # the loss's rows are whole training sequences, whatever generation cuts its prompts to
    answering = evaluation(8, 256, 128)
    assert answering.prompt_tokens == 128
    assert answering.logits_bytes == 8 * 256 * ((vocab + hidden) * 2 + vocab * 8)
    # a soft-capped model's capping holds a second copy of the logits, larger than the chunk here
    gemma = plan(job(model={"name": "google/gemma-2-2b"}, eval={"max_new_tokens": 0, "batch_size": 4},
                     training={"micro_batch_size": 1, "seq_len": 2048})).eval
    assert gemma.logits_bytes == 4 * 2048 * (256000 * 2 * 2 + 2304 * 2)


def test_an_evaluation_fits_beside_training_only_where_both_fit_the_gpu() -> None:
    """A checkpoint's evaluation during training runs on the training's first GPU: it fits beside
    the training where the training's peak and its own fit the GPU together, not merely alone."""
    from planner import constants as C

    def evaluation(gpu_gib: int) -> tuple[Any, Any]:
        p = plan(job(model={"name": "Qwen/Qwen2.5-7B"}, method="lora",
                     eval={"max_new_tokens": 64, "batch_size": 1},
                     training={"micro_batch_size": 1, "seq_len": 1024, "gradient_checkpointing": True},
                     resources={"num_gpus": 1, "zero_stage": 0, "offload_optimizer": "none",
                                "offload_param": "none"},
                     hardware=hardware(gpu_bytes=gpu_gib * GIB)))
        return p.per_gpu, p.eval

    roomy_training, roomy = evaluation(141)
    assert roomy.fits and roomy.fits_beside_training
    usable = lambda gib: gib * GIB * (1 - C.GPU_SAFETY_FRACTION)  # noqa: E731
    # a GPU the training fits but not with the evaluation beside it
    tight = next(g for g in range(20, 141)
                 if usable(g) >= roomy_training.total_bytes
                 and usable(g) < roomy_training.total_bytes + roomy.total_bytes)
    training, squeezed = evaluation(tight)
    assert training.total_bytes <= usable(tight) and squeezed.fits and not squeezed.fits_beside_training


def test_duration_from_dataset_rows() -> None:
    spec = job(
        dataset={"path": "/data/x.jsonl", "num_rows": 10_000, "eval_fraction": 0.0},
        training={"micro_batch_size": 4, "gradient_accumulation_steps": 4, "epochs": 2},
    )
    result = plan(spec)
    assert result.estimated_steps == 2 * 10_000 // 16
    assert result.estimated_duration_seconds == pytest.approx(
        result.estimated_steps * result.estimated_step_seconds, rel=1e-4
    )
    assert plan(job()).estimated_duration_seconds is None


def test_host_ram_short_for_offload() -> None:
    spec = job(
        model={"name": "Qwen/Qwen2.5-7B"},
        method="full",
        resources={"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
        training={"micro_batch_size": 1, "gradient_checkpointing": True},
    )
    result = plan(spec)  # 7B full with everything offloaded needs more than 128 GiB of host RAM
    assert not result.host.fits and not result.fits
    assert "host_ram_short" in {n.code for n in result.warnings}


def test_offload_costs_time() -> None:
    base = job(
        model={"name": "Qwen/Qwen2.5-3B"},
        method="full",
        training={"micro_batch_size": 1, "gradient_checkpointing": True},
        resources={"num_gpus": 1, "zero_stage": 2, "offload_optimizer": "none", "offload_param": "none"},
    )
    offloaded = json.loads(json.dumps(base))
    offloaded["resources"]["offload_optimizer"] = "cpu"
    fast, slow = plan(base), plan(offloaded)
    assert slow.per_gpu.optimizer_states_bytes == 0 < fast.per_gpu.optimizer_states_bytes
    assert slow.host.total_bytes > fast.host.total_bytes
    assert slow.estimated_step_seconds > fast.estimated_step_seconds


def test_importing_the_planner_imports_no_torch() -> None:
    code = (
        "import sys, planner; planner.plan; "
        "print(any(m in sys.modules for m in ('torch', 'deepspeed', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_host_clock_factor_scales_the_host_clock_of_a_step_not_its_gpu_clock() -> None:
    from planner import constants as C
    from planner import host_clock_factor

    def step(model: str, method: str, factor: float | None) -> Plan:
        hw = {**hardware(), "host_clock_factor": factor} if factor else hardware()
        resources = {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "none", "offload_param": "none"}
        training = {"micro_batch_size": 1, "gradient_accumulation_steps": 1, "seq_len": 512,
                    "gradient_checkpointing": True}
        return plan(job(model={"name": model}, method=method, resources=resources, training=training,
                        hardware=hw))

    # a 0.5B LoRA step under ZeRO-3 is all hooks and launches: a probe twice as slow makes the step
    # 2 ** HOST_CLOCK_EXPONENT as long (a probe is a noisy figure of the host, so it moves the
    # clock less than its own ratio), and a probe four times as slow that again
    small, slow = step("Qwen/Qwen2.5-0.5B", "lora", None), step("Qwen/Qwen2.5-0.5B", "lora", 2.0)
    slower = step("Qwen/Qwen2.5-0.5B", "lora", 4.0)
    assert small.host_clock_factor == 1.0 and slow.host_clock_factor == 2.0
    assert 0 < C.HOST_CLOCK_EXPONENT < 1
    scale = 2**C.HOST_CLOCK_EXPONENT
    assert slow.estimated_step_seconds == pytest.approx(scale * small.estimated_step_seconds, rel=0.02)
    assert slower.estimated_step_seconds == pytest.approx(scale * slow.estimated_step_seconds, rel=0.02)
    assert slow.per_gpu == small.per_gpu
    # a faster host cannot take a step below its FLOPs: a 7B step at 16k tokens is the GPU's, and
    # a host four times as fast takes a few percent off it (the clocks' power mean), not half;
    # somewhat more under ZeRO-2, whose engine synchronises host and GPU in every backward
    training = {"micro_batch_size": 4, "gradient_accumulation_steps": 1, "seq_len": 4096,
                "gradient_checkpointing": True}

    def big(stage: int) -> list[float]:
        resources = {"num_gpus": 1, "zero_stage": stage, "offload_optimizer": "none", "offload_param": "none"}
        return [plan(job(model={"name": "Qwen/Qwen2.5-7B"}, resources=resources, training=training,
                         hardware={**hardware(), "host_clock_factor": f})).estimated_step_seconds
                for f in (1.0, 0.5, 0.25)]

    zero0, zero2 = big(0), big(2)
    assert zero0[0] > zero0[1] > zero0[2] > 0.95 * zero0[0]
    assert zero2[0] > zero2[1] > zero2[2] > 0.9 * zero2[0]
    assert zero2[2] / zero2[0] < zero0[2] / zero0[0]
    # the probe's reading over the calibration host's, bounded
    assert host_clock_factor(C.HOST_HOOK_REFERENCE_US * 1.5) == pytest.approx(1.5)
    assert host_clock_factor(1e9) == 50.0
    with pytest.raises(ValueError):
        host_clock_factor(0)
    with pytest.raises(PlanError) as info:
        plan(job(hardware={**hardware(), "host_clock_factor": 0}))
    assert info.value.field == "hardware.host_clock_factor"


def test_close_clocks_take_longer_than_either_and_never_longer_than_both() -> None:
    from planner.speed import overlapped

    assert overlapped(0.63, 1.0, 0.0) == 1.0
    assert overlapped(1e-9, 0.2, 3.0) == 3.0  # q -> 0: the longest
    assert overlapped(1.0, 0.2, 3.0) == pytest.approx(3.2)  # q = 1: one after the other
    assert overlapped(1.0, 0.2, 3.0, 0.5) == pytest.approx(3.7)
    even = overlapped(0.63, 1.0, 1.0)
    assert even == pytest.approx(2**0.63) and overlapped(0.63, 0.5, 1.0) == overlapped(0.63, 1.0, 0.5)
    assert 1.0 < overlapped(0.63, 1.0, 0.1) < 1.02 < overlapped(0.63, 1.0, 0.5) < even
    assert overlapped(0.63, 1.0, 1.0, 1.0) == pytest.approx(3**0.63)
    assert overlapped(1e-4, 1e6, 2e6) == 2e6  # no overflow however small q


def test_the_optimizer_step_walks_every_trainable_tensor_on_the_host() -> None:
    """LoRA's step updates few parameters in many tensors: its time follows the tensors (one A and
    one B per adapted linear and layer) and the host clock, not the parameters."""
    from planner import constants as C

    def step(targets: list[str], factor: float) -> float:
        resources = {"num_gpus": 1, "zero_stage": 0, "offload_optimizer": "none", "offload_param": "none"}
        return plan(job(model={"name": "Qwen/Qwen2.5-0.5B"}, method="lora",
                        lora={"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": targets},
                        resources=resources, hardware={**hardware(), "host_clock_factor": factor},
                        training={"micro_batch_size": 1, "gradient_accumulation_steps": 1,
                                  "seq_len": 512, "gradient_checkpointing": False})
                    ).estimated_step_seconds

    # 24 layers: two more adapted linears are 96 more tensors; the host clock scales their walk
    for factor in (1.0, 2.0):
        two, four = step(["q_proj", "v_proj"], factor), step(["q_proj", "k_proj", "v_proj", "o_proj"], factor)
        assert four - two >= 96 * C.OPTIMIZER_STEP_TENSOR_SECONDS * factor**C.HOST_CLOCK_EXPONENT


def test_only_zero2_keeps_a_host_accumulation_buffer_under_optimizer_offload() -> None:
    """ZeRO-2 moves every micro-step's gradients into a bf16 host buffer per parameter (2 bytes a
    parameter more with accumulation); ZeRO-1 keeps them in .grad on the GPU until the boundary, so
    its host memory does not grow with accumulation (host RSS on an H200 box: llama-3.2-3b,
    accumulation 2, +9.2% planned with the buffer, +0.2% without)."""

    def host_grads(stage: int, accumulation: int) -> int:
        spec = job(
            method="full",
            training={"micro_batch_size": 1, "gradient_accumulation_steps": accumulation, "seq_len": 512},
            resources={"num_gpus": 1, "zero_stage": stage, "offload_optimizer": "cpu",
                       "offload_param": "none"},
        )
        return plan(spec).host.gradients_bytes

    trainable = plan(job(method="full")).model.trainable_parameters
    assert host_grads(1, 4) == host_grads(1, 1)
    assert host_grads(2, 4) - host_grads(2, 1) == 2 * trainable


def test_zero3_cpu_step_costs_more_only_where_it_copies_the_updated_weights_to_the_gpu() -> None:
    """Under ZeRO-3 the CPU optimizer copies each updated fp32 sub-group into the GPU's bf16
    partition and waits for it; with the parameters offloaded too they stay on the host, and the
    step takes what ZeRO-1/2's does per parameter."""
    from dataclasses import replace

    from planner.core import _base_setup, prepare
    from planner.speed import step_phases, step_terms

    p = prepare(job(model={"name": "Qwen/Qwen2.5-0.5B"}, method="full"))
    base = replace(_base_setup(p), num_gpus=1, offload_optimizer="cpu", gradient_accumulation_steps=1)
    k = SpeedConstants()

    def cpu_step(stage: int, offload_param: str) -> float:
        t = step_terms(p.facts, replace(base, zero_stage=stage, offload_param=offload_param), p.rates)
        return step_phases(t, k)[1] - step_phases(replace(t, cpu_optimizer_params=0.0), k)[1]

    trainable = p.facts.trainable_parameters
    assert cpu_step(3, "none") == pytest.approx(trainable * k.cpu_optimizer_s_per_param_zero3)
    assert cpu_step(3, "cpu") == pytest.approx(trainable * k.cpu_optimizer_s_per_param_zero12)
    assert cpu_step(2, "none") == pytest.approx(cpu_step(3, "cpu"))
    assert cpu_step(3, "none") > cpu_step(3, "cpu")


def test_optimizer_offload_sends_gradients_in_the_boundary_backward_and_weights_in_the_step() -> None:
    """DeepSpeed sends each gradient to the host from its backward hook at the accumulation
    boundary (fp32, 4 bytes a parameter), beside the compute; ZeRO-2 keeps a bf16 host buffer that
    the first micro-step sends down and every later one, the boundary's included, brings back and
    sends down again; ZeRO-1 and ZeRO-3 keep the gradients on the GPU until the boundary; the
    optimizer step sends only the updated bf16 weights back, nothing when the parameters live on
    the host."""
    from dataclasses import replace

    from planner import constants as C
    from planner.core import _base_setup, prepare
    from planner.speed import step_phases, step_terms

    p = prepare(job(model={"name": "Qwen/Qwen2.5-0.5B"}, method="full"))
    base = replace(_base_setup(p), num_gpus=2, offload_optimizer="cpu")
    part = p.facts.trainable_parameters / 2
    pcie = C.PCIE_BYTES_PER_S

    def terms(stage: int, accumulation: int, offload_param: str = "none") -> StepTerms:
        s = replace(base, zero_stage=stage, gradient_accumulation_steps=accumulation,
                    offload_param=offload_param)
        return step_terms(p.facts, s, p.rates)

    one = terms(2, 1)
    assert one.micro_offload_seconds == 0
    assert one.boundary_offload_seconds == pytest.approx(4 * part / pcie)
    assert one.step_offload_seconds == pytest.approx(2 * part / pcie)
    four = terms(2, 4)
    # down, then up and down twice: the mean of the three micro-steps before the boundary
    assert four.micro_offload_seconds == pytest.approx(5 / 3 * 2 * part / pcie)
    assert four.boundary_offload_seconds == pytest.approx((2 * 2 + 4) * part / pcie)
    two = terms(2, 2)
    assert two.micro_offload_seconds == pytest.approx(2 * part / pcie)
    z1 = terms(1, 4)
    assert z1.micro_offload_seconds == 0 and z1.boundary_offload_seconds == pytest.approx(4 * part / pcie)
    z3 = terms(3, 4)
    assert z3.micro_offload_seconds == 0 and z3.boundary_offload_seconds == pytest.approx(4 * part / pcie)
    assert z3.step_offload_seconds == pytest.approx(2 * part / pcie)
    hosted = terms(3, 1, "cpu")
    assert hosted.step_offload_seconds == 0
    assert hosted.boundary_offload_seconds - hosted.micro_offload_seconds == pytest.approx(4 * part / pcie)
    # the gradients move beside the backward (overlap_comm): the boundary micro-step takes less than
    # its compute and its traffic one after the other, and more than the compute alone
    k = SpeedConstants()
    passes, _ = step_phases(one, k)
    alone, _ = step_phases(replace(one, boundary_offload_seconds=0.0), k)
    assert alone < passes < alone + one.boundary_offload_seconds


def test_box_step_time_factor_scales_every_speed_figure_and_nothing_else() -> None:
    spec = job(
        dataset={"path": "/data/x.jsonl", "num_rows": 10_000, "eval_fraction": 0.0},
        resources={"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "none"},
    )
    plain = plan(spec)
    slow = plan({**spec, "hardware": {**spec["hardware"], "step_time_factor": 1.5}})
    assert plain.step_time_factor == 1.0 and slow.step_time_factor == 1.5
    assert slow.estimated_step_seconds == pytest.approx(1.5 * plain.estimated_step_seconds, rel=1e-5)
    assert slow.estimated_tokens_per_second == pytest.approx(
        plain.estimated_tokens_per_second / 1.5, rel=1e-5)
    assert slow.estimated_duration_seconds == pytest.approx(1.5 * plain.estimated_duration_seconds, rel=1e-5)
    assert [a.estimated_step_seconds for a in slow.alternatives] == pytest.approx(
        [1.5 * a.estimated_step_seconds for a in plain.alternatives], rel=1e-5)
    assert slow.per_gpu == plain.per_gpu and slow.host == plain.host and slow.resolved == plain.resolved
    with pytest.raises(PlanError) as info:
        plan({**spec, "hardware": {**spec["hardware"], "step_time_factor": 0}})
    assert info.value.field == "hardware.step_time_factor"


def test_nvme_offload_on_a_box_where_it_cannot_run_is_refused_with_the_reason() -> None:
    why = "DeepSpeed's async I/O op does not build here"
    box = {**hardware(nvme_gib=2048), "nvme_unavailable": why}
    for resources, field in (
        ({"zero_stage": 3, "offload_optimizer": "nvme"}, "resources.offload_optimizer"),
        ({"zero_stage": 3, "offload_param": "nvme", "offload_optimizer": "cpu"}, "resources.offload_param"),
        ({"deepspeed": {"offload_param": {"device": "nvme"}}}, "resources.deepspeed.offload_param.device"),
    ):
        with pytest.raises(PlanError) as info:
            plan(job(resources=resources, hardware=box))
        assert info.value.field == field and why in info.value.message
    # "auto" never reaches for NVMe there: a 7B full fine-tune whose states only NVMe can hold
    small_host = hardware(gpu_bytes=48 * GIB, host_gib=64, nvme_gib=4000)
    big = job(model={"name": "Qwen/Qwen2.5-7B"}, method="full", resources={"num_gpus": 1},
              training={"micro_batch_size": 1, "gradient_accumulation_steps": 8, "seq_len": 1024,
                        "gradient_checkpointing": True})
    assert plan({**big, "hardware": small_host}).resolved.offload_optimizer == "nvme"
    refused = plan({**big, "hardware": {**small_host, "nvme_unavailable": why}})
    assert not refused.fits
    assert "nvme" not in (refused.resolved.offload_optimizer, refused.resolved.offload_param)
    assert refused.nvme.capacity_bytes == 0
    assert any(n.code == "nvme_unavailable" and why in n.message for n in refused.warnings)


def test_allocator_slack_grows_with_the_loss_blocks_of_a_micro_batch() -> None:
    from planner import constants as C

    def slack(seq_len: int) -> int:
        training = {"micro_batch_size": 2, "gradient_accumulation_steps": 1, "seq_len": seq_len,
                    "gradient_checkpointing": True}
        spec = job(training=training, resources={"num_gpus": 1, "zero_stage": 0})
        return plan(spec).per_gpu.allocator_slack_bytes

    vocab = 151936  # Qwen2.5-0.5B
    # the checkpointed forward's free segments (CHECKPOINT_SEGMENTS): 24 layers' checkpoints (hidden
    # 896) in blocks of the MLP intermediate (4864), five to a block, seven blocks with the two of the
    # last layer's MLP; the adapters' largest gradient block holds the same few bytes of it at both
    segments_per_token = 2 * (7 * 4864 - 24 * 896)
    grown = slack(8192) - slack(1024)
    loss = C.ALLOCATOR_LOGITS_BLOCKS * 4 * vocab * 2 * 7168
    assert grown == pytest.approx(loss + segments_per_token * 2 * 7168, abs=2)
    assert grown > 1 * GIB  # 14k more tokens over a 152k vocabulary: not a rounding term


def test_zero3_fetches_cache_blocks_of_the_embeddings_size_under_lora_and_of_the_gathers_under_full() -> None:
    """Where ZeRO-3 fetches parameters (two GPUs here) the slack gains, under LoRA, the
    embedding-sized blocks of the gathered embedding and LM head; under full fine-tuning, whose
    gradients reuse those, blocks in proportion to the gathered parameters instead."""
    from planner import constants as C

    def per_gpu(model: str, method: str, gpus: int) -> Any:
        resources = {"num_gpus": gpus, "zero_stage": 3, "offload_optimizer": "none", "offload_param": "none"}
        spec = job(model={"name": model}, method=method, resources=resources,
                   hardware=hardware(gpus=gpus, host_gib=512))
        return plan(spec).per_gpu

    for model, vocab, hidden in (("meta-llama/Llama-3.1-8B", 128256, 4096),
                                 ("mistralai/Mistral-7B-v0.3", 32768, 4096)):
        one, two = per_gpu(model, "lora", 1), per_gpu(model, "lora", 2)
        assert two.gathered_parameters_bytes > 0 == one.gathered_parameters_bytes
        grown = two.allocator_slack_bytes - one.allocator_slack_bytes
        assert grown == pytest.approx(C.ALLOCATOR_VOCABULARY_BLOCKS * 2 * vocab * hidden, abs=2)
    one, two = per_gpu("meta-llama/Llama-3.2-1B", "full", 1), per_gpu("meta-llama/Llama-3.2-1B", "full", 2)
    grown = two.allocator_slack_bytes - one.allocator_slack_bytes
    assert grown == pytest.approx(C.ALLOCATOR_GATHERED_BLOCKS * two.gathered_parameters_bytes, abs=2)


def test_zero1_step_runs_beside_the_per_parameter_gradients_it_freed() -> None:
    def per_gpu(stage: int) -> Any:
        resources = {"num_gpus": 2, "zero_stage": stage, "offload_optimizer": "none", "offload_param": "none"}
        training = {"micro_batch_size": 1, "gradient_accumulation_steps": 2, "seq_len": 1024,
                    "gradient_checkpointing": True}
        spec = job(model={"name": "microsoft/Phi-3-mini-4k-instruct"}, method="full", resources=resources,
                   training=training, hardware=hardware(gpus=2, host_gib=512))
        return plan(spec).per_gpu

    one, two = per_gpu(1), per_gpu(2)
    params = 3_821_079_552  # Phi-3 mini
    # ZeRO-1: the bf16 gradients' blocks stay reserved under the step's flat fp32 partition
    assert one.total_bytes == one.optimizer_step_bytes + 2 * params + one.cuda_context_bytes
    assert one.peak_phase == "optimizer_step"
    assert one.required_bytes < one.total_bytes  # cached blocks an allocator short of memory frees
    # ZeRO-2 keeps its gradients in its buckets and partition: no such floor
    assert two.total_bytes == max(two.forward_backward_bytes, two.optimizer_step_bytes) + \
        two.allocator_slack_bytes + two.cuda_context_bytes


def test_zero2_buckets_stay_cached_with_optimizer_offload_when_the_partition_outgrows_one() -> None:
    from planner import constants as C

    def slack(model: str) -> int:
        resources = {"num_gpus": 1, "zero_stage": 2, "offload_optimizer": "cpu", "offload_param": "none"}
        spec = job(model={"name": model}, method="full", resources=resources)
        return plan(spec).per_gpu.allocator_slack_bytes

    def expected(vocab: int, hidden: int, intermediate: int, buckets: int) -> float:
        # the reduction stream's fp64 norm copies: a layer's MLP weight (the first bucket's largest),
        # then the tied embedding's
        norms = 8 * (hidden * intermediate + vocab * hidden)
        return (C.ALLOCATOR_SLACK_BYTES + C.ALLOCATOR_LOGITS_BLOCKS * 4 * vocab * 4 * 1024
                + norms + buckets * int(5e8) * 2)

    # Llama 3.2 3B: 6.4 GB of bf16 gradients, several buckets, two of them cached (overlap_comm);
    # Qwen2.5-0.5B: its 1.0 GB fit in one bucket, which the offloaded step reuses
    assert slack("meta-llama/Llama-3.2-3B") == pytest.approx(expected(128256, 3072, 8192, 2), abs=4)
    assert slack("Qwen/Qwen2.5-0.5B") == pytest.approx(expected(151936, 896, 4864, 0), abs=4)


def test_zero2_accumulation_caches_one_more_block_of_the_gradient_partition() -> None:
    """Under ZeRO-2 with the optimizer on the GPU, micro-steps before the boundary accumulate into
    the rank's bf16 gradient partition, whose block the fp32 step cannot reuse: one more such block
    in the slack (Phi-3 mini on one GPU cached 7.15 GiB more with two micro-steps than with one);
    not with the optimizer offloaded, nor under ZeRO-1 or -3."""
    from planner import constants as C

    def slack(stage: int, gpus: int, accumulation: int, offload: str = "none") -> int:
        resources = {"num_gpus": gpus, "zero_stage": stage, "offload_optimizer": offload,
                     "offload_param": "none"}
        training = {"micro_batch_size": 1, "gradient_accumulation_steps": accumulation, "seq_len": 1024,
                    "gradient_checkpointing": True}
        spec = job(model={"name": "microsoft/Phi-3-mini-4k-instruct"}, method="full", resources=resources,
                   training=training, hardware=hardware(gpus=2, host_gib=512))
        return plan(spec).per_gpu.allocator_slack_bytes

    params = 3_821_079_552  # Phi-3 mini
    assert C.ALLOCATOR_ACCUMULATION_BLOCKS == 1
    for gpus in (1, 2):
        assert slack(2, gpus, 4) - slack(2, gpus, 1) == pytest.approx(2 * params / gpus, abs=4)
        assert slack(2, gpus, 4, "cpu") == slack(2, gpus, 1, "cpu")
        assert slack(1, gpus, 4) == slack(1, gpus, 1)
        assert slack(3, gpus, 4) == slack(3, gpus, 1)


def test_zero3_optimizer_offload_holds_a_bf16_sub_group_on_the_host_during_the_step() -> None:
    from planner import constants as C

    def host(offload_param: str) -> Any:
        resources = {"num_gpus": 2, "zero_stage": 3, "offload_optimizer": "cpu",
                     "offload_param": offload_param}
        spec = job(model={"name": "Qwen/Qwen2.5-3B"}, method="full", resources=resources,
                   hardware=hardware(gpus=2, host_gib=256))
        return plan(spec).host

    gpu, cpu = host("none"), host("cpu")
    # 1.5e9 parameters per rank: the sub-groups close at sub_group_size (1e9) elements, and the
    # step's bf16 copy of the largest one is on the host next to the fp32 master
    copy = gpu.master_weights_bytes - cpu.master_weights_bytes
    assert 2 * 2 * 1e9 <= copy < 2 * 2 * 1.2e9
    # with the parameters on the host, the conversion happens in place; their bookkeeping costs more
    assert cpu.process_bytes - gpu.process_bytes == 2 * C.HOST_PARAM_OFFLOAD_BYTES


def test_a_tied_lm_head_keeps_its_own_pinned_block_under_parameter_offload() -> None:
    """zero.Init partitions the LM head's weight before transformers ties it to the embedding: with
    the parameters offloaded a tied model holds as many pinned parameter bytes as the same model
    untied (one embedding-sized block per rank more than its partitions, as the H200 records show)."""
    def params(tied: bool, offload_param: str) -> int:
        config = {**TINY_CONFIGS["llama"], "tie_word_embeddings": tied}
        resources = {"num_gpus": 2, "zero_stage": 3, "offload_optimizer": "cpu",
                     "offload_param": offload_param}
        spec = job(model={"config": config}, method="lora", resources=resources,
                   hardware=hardware(gpus=2, host_gib=64))
        return plan(spec).host.parameters_bytes

    assert params(True, "cpu") == params(False, "cpu") > 0
    assert params(True, "none") == params(False, "none") == 0


def test_zero3_stages_the_trainable_partitions_through_the_host_at_initialization() -> None:
    """deepspeed.initialize flattens the partitions of the parameters it keeps on the GPU by
    copying them into one host buffer (``defragment``): a full 7B job under ZeRO-3 needs host RAM
    for its bf16 weights at start, LoRA only for its adapters, parameter offload none."""
    from planner import constants as C

    def host(method: str, offload_param: str = "none", gpus: int = 2) -> Any:
        resources = {"num_gpus": gpus, "zero_stage": 3, "offload_optimizer": "none",
                     "offload_param": offload_param}
        if offload_param != "none":
            resources["offload_optimizer"] = "cpu"
        spec = job(model={"name": "Qwen/Qwen2.5-7B"}, method=method, resources=resources,
                   hardware=hardware(gpus=gpus, host_gib=512))
        return plan(spec)

    full = host("full")
    params = full.model.trainable_parameters
    assert full.host.partition_staging_bytes == pytest.approx(2 * params, rel=1e-6)
    # the staging peak: every rank at its size before the first step, plus all the partitions
    # (here below the checkpoint save, where rank 0 holds the whole 16-bit model)
    staging_peak = 2 * C.HOST_INIT_PROCESS_BYTES + 2 * params
    assert full.host.total_bytes >= staging_peak
    assert host("full", gpus=1).host.partition_staging_bytes == pytest.approx(2 * params, rel=1e-6)
    lora = host("lora")
    assert lora.host.partition_staging_bytes == pytest.approx(2 * lora.model.trainable_parameters, rel=1e-6)
    assert lora.host.total_bytes == lora.host.process_bytes + lora.host.model_load_bytes
    assert host("full", offload_param="cpu").host.partition_staging_bytes == 0


def test_a_checkpoint_save_holds_host_copies_of_what_it_saves() -> None:
    """torch.save copies each GPU storage of the engine to the host one at a time (the largest: the
    fp32 master of an optimizer on the GPU), then rank 0 holds the 16-bit weights it writes (a tied
    embedding twice, once per name of the state dict): both come on top of the training process
    and what it keeps on the host."""
    from planner import constants as C

    def planned(method: str = "full", offload: str = "none", gpus: int = 1, stage: int = 1,
                optimizer: str = "adamw") -> Any:
        resources = {"num_gpus": gpus, "zero_stage": stage, "offload_optimizer": offload,
                     "offload_param": "none"}
        spec = job(model={"name": "Qwen/Qwen2.5-0.5B"}, method=method, resources=resources,
                   hardware=hardware(gpus=gpus, host_gib=256))
        spec["training"]["optimizer"] = optimizer
        return plan(spec)

    on_gpu = planned()
    m = on_gpu.model
    params, tied = m.num_parameters, m.vocab_size * m.hidden_size
    assert m.tie_word_embeddings
    assert on_gpu.host.checkpoint_save_bytes == pytest.approx(4 * params, rel=1e-6)
    assert on_gpu.host.total_bytes == on_gpu.host.training_process_bytes + on_gpu.host.checkpoint_save_bytes
    assert on_gpu.host.training_process_bytes == C.HOST_TRAINING_PROCESS_BYTES

    offloaded = planned(offload="cpu")
    h = offloaded.host
    assert h.checkpoint_save_bytes == pytest.approx(2 * (params + tied), rel=1e-6)
    resident = (h.optimizer_states_bytes + h.master_weights_bytes + h.gradients_bytes
                + h.pinned_buffers_bytes)
    assert h.total_bytes == h.training_process_bytes + resident + h.checkpoint_save_bytes

    # two ranks each copy half the master; only rank 0 copies the weights
    two = planned(gpus=2).host
    assert two.checkpoint_save_bytes == pytest.approx(4 * params / 2 + 2 * (params + tied), rel=1e-6)
    # LoRA writes its adapters: nothing the size of the model
    assert planned(method="lora").host.checkpoint_save_bytes < 0.05 * params
    # ZeRO-0 flattens the masters for FusedAdam only; any other optimizer keeps one per parameter,
    # and the largest copy is then the weights rank 0 writes
    assert planned(stage=0).host.checkpoint_save_bytes == pytest.approx(4 * params, rel=1e-6)
    for other in ("lion", "sgd", "adamw_8bit"):
        assert planned(stage=0, optimizer=other).host.checkpoint_save_bytes == pytest.approx(
            2 * (params + tied), rel=1e-6)
    assert planned(optimizer="lion").host.checkpoint_save_bytes == pytest.approx(4 * params, rel=1e-6)


def test_loss_caches_one_more_block_where_the_first_steps_moments_take_one_of_its_own() -> None:
    """The GPU optimizer creates its flat moments at the first step (ZeRO-1/2: one per partition,
    ZeRO-3: per sub-group); where each is larger than every block a decoder layer frees (an MLP
    intermediate, or eager attention's fp32 scores) it takes a block the loss freed, and the loss
    needs one more fp32 logits block from then on: a soft-capped loss for a moment in any of its
    blocks, an uncapped one only when the moments do not fit together in its bf16 logits block.
    ZeRO-0's optimizer creates its moments at initialisation: the baseline."""
    from planner import constants as C

    def slack(model: str, stage: int, seq_len: int = 1024, attention: str = "sdpa", method: str = "lora",
              targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")) -> int:
        training = {"micro_batch_size": 2, "gradient_accumulation_steps": 1, "seq_len": seq_len,
                    "gradient_checkpointing": True, "attn_implementation": attention}
        resources = {"num_gpus": 1, "zero_stage": stage, "offload_optimizer": "none", "offload_param": "none"}
        spec = job(model={"name": model}, method=method, training=training, resources=resources,
                   lora={"r": 16, "alpha": 32, "target_modules": list(targets)})
        return plan(spec).per_gpu.allocator_slack_bytes

    assert C.ALLOCATOR_MOMENTS_BLOCKS == 1
    nine = "google/gemma-2-9b"
    # Gemma 2 9B, r=16 on q/k/v/o: 68 MiB moments against 2 x 1024 x 14336 bf16 = 56 MiB intermediates
    assert slack(nine, 1) - slack(nine, 0) == pytest.approx(4 * 256000 * 2048, abs=2)
    assert slack(nine, 2) == slack(nine, 1) == slack(nine, 3)
    # twice the tokens: 112 MiB intermediates hold the moments; so do eager attention's 128 MiB scores
    assert slack(nine, 1, seq_len=2048) == slack(nine, 0, seq_len=2048)
    assert slack(nine, 1, attention="eager") == slack(nine, 0, attention="eager")
    # Gemma 2 2B: 24 MiB moments fit in its 36 MiB intermediates
    assert slack("google/gemma-2-2b", 1) == slack("google/gemma-2-2b", 0)
    # no soft-capping: Llama 3.1 8B with every projection adapted has two 160 MiB moments, which fit
    # together in its 501 MiB bf16 logits block
    every = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    llama = "meta-llama/Llama-3.1-8B"
    assert slack(llama, 1, targets=every) == slack(llama, 0, targets=every)
    # ... Qwen2.5-0.5B's full fine-tuning at 2 x 4096 tokens has two 1.84 GiB moments, which do not
    # fit in its 2.32 GiB bf16 logits block
    qwen = "Qwen/Qwen2.5-0.5B"
    grown = slack(qwen, 1, seq_len=4096, method="full") - slack(qwen, 0, seq_len=4096, method="full")
    assert grown == pytest.approx(4 * 151936 * 8192, abs=2)
