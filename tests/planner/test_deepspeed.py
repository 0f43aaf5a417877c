"""Model states against DeepSpeed's own arithmetic; generated configs against its config models."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from planner import (
    Setup,
    ZeroKnobs,
    arch_from_config,
    estimate_memory,
    model_facts,
    plan,
    to_hf_trainer_config,
)
from planner.catalogue import catalogue
from planner.dsconfig import OFFLOAD_OPTIMIZER_KEYS, OFFLOAD_PARAM_KEYS, ZERO_KEYS
from planner.errors import PlanError
from planner.lora import resolve_lora
from tests.planner.support import GIB, hardware, job

# The ds_config tests read DeepSpeed's pydantic models; they need no distributed setup.
ds_zero = pytest.importorskip("deepspeed.runtime.zero.config")


def _facts(name: str = "Qwen/Qwen2.5-7B") -> Any:
    return model_facts(arch_from_config(catalogue()[name].config), "full", None, "bf16")


def _setup(**kw: Any) -> Setup:
    base: dict[str, Any] = dict(
        method="full",
        num_gpus=1,
        zero_stage=2,
        offload_optimizer="none",
        offload_param="none",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        seq_len=512,
        gradient_checkpointing=True,
        precision="bf16",
        optimizer="adamw",
        knobs=ZeroKnobs(param_persistence_threshold=0),
    )
    base.update(kw)
    return Setup(**base)


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_zero2_states_match_deepspeed(gpus: int) -> None:
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    facts = _facts()
    p = facts.trainable_parameters
    m = estimate_memory(facts, _setup(num_gpus=gpus))
    _, ds_gpu = estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=gpus, cpu_offload=False)
    # DeepSpeed: 2 (bf16 params) + 18/N (2 bf16 grads + 4 fp32 grads + 4 fp32 master + 8 moments).
    # Ours at the optimizer step: the same terms (fp32 grads exist then, with the bf16 flat copy).
    ours = m.weights_bytes + (2 * p) // gpus + m.optimizer_states_bytes + 4 * p // gpus
    assert abs(ours - ds_gpu) <= gpus


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_zero2_offload_host_states_match_deepspeed(gpus: int) -> None:
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    facts = _facts()
    p = facts.trainable_parameters
    s = _setup(
        num_gpus=gpus,
        offload_optimizer="cpu",
        gradient_accumulation_steps=1,
        knobs=ZeroKnobs(pin_memory=False),
    )
    m = estimate_memory(facts, s)
    ds_cpu, ds_gpu = estimate_zero2_model_states_mem_needs(
        p, num_gpus_per_node=gpus, cpu_offload=True, additional_buffer_factor=1.0
    )
    host_states = m.host.master_weights_bytes + m.host.gradients_bytes + m.host.optimizer_states_bytes
    assert abs(host_states - ds_cpu) <= 16 * gpus  # 16 B/param: fp32 master, grads, two moments
    assert m.weights_bytes == ds_gpu


@pytest.mark.parametrize(("gpus", "offload"), [(1, False), (4, False), (8, False), (2, True), (8, True)])
def test_zero3_states_match_deepspeed(gpus: int, offload: bool) -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    facts = _facts()
    p = facts.trainable_parameters
    largest = facts.arch.largest_param
    s = _setup(
        num_gpus=gpus,
        zero_stage=3,
        offload_optimizer="cpu" if offload else "none",
        offload_param="cpu" if offload else "none",
        # One sub-group, as DeepSpeed's estimate assumes (with several, only the largest
        # sub-group's fp32 gradients are resident at a time).
        knobs=ZeroKnobs(param_persistence_threshold=0, pin_memory=False, sub_group_size=10**12),
    )
    m = estimate_memory(facts, s)
    ds_cpu, ds_gpu, largest_mem = estimate_zero3_model_states_mem_needs(
        p,
        largest,
        num_gpus_per_node=gpus,
        cpu_offload=offload,
        cpu_offload_params=offload,
        additional_buffer_factor=1.0,
    )
    if offload:
        # DeepSpeed: 18 B/param on the host (bf16 params + fp32 master, grads, moments) — ours adds
        # the bf16 gradient partition buffer stage3.py keeps there (grad_partitions_flat_buffer).
        host = (
            m.host.parameters_bytes
            + m.host.master_weights_bytes
            + m.host.gradients_bytes
            + m.host.optimizer_states_bytes
        )
        assert abs(host - 2 * p - ds_cpu) <= 32 * gpus
        assert m.weights_bytes == 0 and m.optimizer_states_bytes == 0
    else:
        # DeepSpeed: 18/N (bf16 params + fp32 master, grads, moments). stage3.py creates the fp32
        # gradients only inside the step (flatten the bf16 sub-group, upcast, drop after the update):
        # the step transient is that bf16 flat copy (2/N) plus the fp32 gradients (4/N).
        ours = m.weights_bytes + m.optimizer_states_bytes + m.optimizer_step_transient_bytes - 2 * p // gpus
        assert abs(ours - (ds_gpu - largest_mem)) <= 8 * gpus


def _installed_keys(model: Any) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def test_zero_keys_match_installed_deepspeed() -> None:
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    deprecated = {
        "cpu_offload",
        "cpu_offload_param",
        "cpu_offload_use_pin_memory",
        "stage3_gather_fp16_weights_on_model_save",
    }
    assert _installed_keys(ds_zero.DeepSpeedZeroConfig) - deprecated == set(ZERO_KEYS)
    assert _installed_keys(DeepSpeedZeroOffloadOptimizerConfig) == set(OFFLOAD_OPTIMIZER_KEYS)
    assert _installed_keys(DeepSpeedZeroOffloadParamConfig) == set(OFFLOAD_PARAM_KEYS)


CONFIG_CASES: list[dict[str, Any]] = [
    {"zero_stage": 0, "offload_optimizer": "none", "offload_param": "none"},
    {"zero_stage": 1, "offload_optimizer": "none", "offload_param": "none"},
    {"zero_stage": 2, "offload_optimizer": "cpu", "offload_param": "none"},
    {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    {
        "zero_stage": 3,
        "offload_optimizer": "nvme",
        "offload_param": "nvme",
        "deepspeed": {"stage3_max_live_parameters": 3e8, "offload_param": {"buffer_count": 6}},
    },
]


@pytest.mark.parametrize("resources", CONFIG_CASES)
@pytest.mark.parametrize("optimizer", ["adamw", "lion", "sgd", "adamw_8bit"])
def test_generated_config_is_accepted_by_deepspeed(resources: dict[str, Any], optimizer: str) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    if optimizer == "adamw_8bit" and resources["offload_optimizer"] != "none":
        pytest.skip("bitsandbytes' optimizer runs on the GPU only")
    spec = job(resources={"num_gpus": 1, **resources}, hardware=hardware(nvme_gib=2000))
    spec["training"]["optimizer"] = optimizer
    cfg = plan(spec).deepspeed_config
    parsed = DeepSpeedConfig(json.loads(json.dumps(cfg)))  # what a JSON file round-trip gives
    assert parsed.zero_optimization_stage == resources["zero_stage"]
    assert parsed.train_batch_size == 16 and parsed.gradient_accumulation_steps == 4
    assert parsed.bfloat16_config.enabled
    zero = ds_zero.DeepSpeedZeroConfig(**cfg["zero_optimization"])
    if resources["zero_stage"] == 3:
        assert zero.param_persistence_threshold == 100_000
    if resources["offload_optimizer"] != "none":
        assert cfg["zero_force_ds_cpu_optimizer"] is False
        assert zero.offload_optimizer is not None and zero.offload_optimizer.pin_memory


def test_pinned_knobs_reach_the_config() -> None:
    spec = job(
        resources={
            "num_gpus": 1,
            "zero_stage": 3,
            "offload_optimizer": "none",
            "offload_param": "none",
            "deepspeed": {
                "reduce_bucket_size": 2e7,
                "stage3_max_reuse_distance": 0,
                "zero_quantized_weights": False,
            },
        }
    )
    zero = plan(spec).deepspeed_config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 20_000_000
    assert zero["stage3_max_reuse_distance"] == 0
    assert zero["zero_quantized_weights"] is False
    ds_zero.DeepSpeedZeroConfig(**zero)


def test_hf_trainer_form_uses_auto_for_trainer_owned_values() -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = plan(job()).deepspeed_config
    hf = to_hf_trainer_config(cfg)
    assert hf["train_micro_batch_size_per_gpu"] == "auto" and hf["train_batch_size"] == "auto"
    assert hf["gradient_accumulation_steps"] == "auto" and hf["gradient_clipping"] == "auto"
    assert hf["optimizer"]["params"] == {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}
    assert hf["bf16"]["enabled"] == "auto"
    assert hf["zero_optimization"] == cfg["zero_optimization"]
    assert cfg["train_batch_size"] == 16  # the original is left untouched
    transformers_ds = pytest.importorskip("transformers.integrations.deepspeed")
    args = pytest.importorskip("transformers").TrainingArguments(
        output_dir="/tmp/unused",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        bf16=True,
        use_cpu=True,
    )
    hf_cfg = transformers_ds.HfTrainerDeepSpeedConfig(hf)
    hf_cfg.trainer_config_process(args)
    filled = hf_cfg.config
    assert filled["train_micro_batch_size_per_gpu"] == 4 and filled["gradient_accumulation_steps"] == 4
    DeepSpeedConfig(filled)


@pytest.mark.parametrize(
    ("name", "gpus", "sub_group_size"),
    [("Qwen/Qwen2.5-3B", 1, 10**9), ("Qwen/Qwen2.5-7B", 2, 10**9), ("meta-llama/Llama-3.2-3B", 2, 3 * 10**8)],
)
def test_zero3_sub_groups_are_deepspeeds(name: str, gpus: int, sub_group_size: int) -> None:
    """ZeRO-3 groups the optimizer's partitions exactly as DeepSpeed's own ``_create_fp16_sub_groups``
    does over the model's parameters in order (the offloaded fp32 gradients are pinned per group)."""
    import math
    import types

    import torch
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from transformers import AutoConfig, AutoModelForCausalLM

    from planner.memory import _sub_groups

    cfg = dict(catalogue()[name].config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    def partition(numel: int) -> Any:  # a parameter as the grouping sees it: its padded partition
        return types.SimpleNamespace(partition_numel=lambda: math.ceil(numel / gpus))

    params = [partition(p.numel()) for p in model.parameters()]
    owner = types.SimpleNamespace(sub_group_size=sub_group_size)
    theirs = DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(owner, params)  # type: ignore[arg-type]
    sizes = tuple(sum(p.partition_numel() for p in group) for group in theirs)
    facts = model_facts(arch_from_config(cfg), "full", None, "bf16")
    assert len(sizes) > 1
    assert _sub_groups(facts, gpus, sub_group_size) == sizes


def test_zero3_reads_the_checkpoint_one_weight_file_at_a_time(tmp_path: Any) -> None:
    """from_pretrained under ZeRO-3 holds the largest weight file on the host of every rank."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(catalogue()["Qwen/Qwen2.5-1.5B"].config))
    for i, size in enumerate((300_000_000, 1_500_000_000)):
        with (folder / f"model-0000{i + 1}-of-00002.safetensors").open("wb") as f:
            f.truncate(size)  # sparse: only its size matters
    spec = job(model={"path": str(folder)}, method="lora")
    spec["resources"].update(num_gpus=2, zero_stage=3, offload_optimizer="none", offload_param="none")
    spec["hardware"] = hardware(gpus=2)
    from_folder = plan(spec).host
    assert from_folder.model_load_bytes == 2 * 1_500_000_000
    assert from_folder.total_bytes == from_folder.process_bytes + 2 * 1_500_000_000
    # without the files at hand: the whole model, as long as it is under the hub's 5 GB files
    spec["model"] = {"config": catalogue()["Qwen/Qwen2.5-0.5B"].config}
    spec["method"] = "full"
    assert plan(spec).host.model_load_bytes == pytest.approx(2 * 2 * 494_032_768, rel=0.01)


def test_zero3_parameter_offload_pins_a_flat_copy_of_the_trainable_partitions() -> None:
    """``_create_param_groups_fp16_flat_cpu_memory``: one pinned bf16 buffer of each rank's trainable
    partition, rounded up to a power of two by torch's pinned allocator, beside the per-parameter
    partitions; LoRA's is the adapters' alone."""
    facts = _facts("meta-llama/Llama-3.2-1B")
    p = facts.trainable_parameters
    knobs = ZeroKnobs(param_persistence_threshold=100_000)
    full = _setup(zero_stage=3, offload_optimizer="cpu", offload_param="cpu", num_gpus=2, knobs=knobs)
    host = estimate_memory(facts, full).host
    assert host.pinned_buffers_bytes == 2 * 2 ** (2 * p // 2 - 1).bit_length()
    without = estimate_memory(facts, full.with_(offload_param="none")).host
    assert without.pinned_buffers_bytes == 0


def test_offloaded_gradient_reduction_follows_deepspeeds_copies() -> None:
    """What reducing a gradient adds with the optimizer offloaded (stage_1_and_2.py's
    ``set_norm_for_param_grad_in_gpu``; stage3.py's ``partition_grads`` and
    ``_offload_grad_partition_at_boundary``), from the tensors those functions create."""
    from planner.memory import _at_offloaded_gradient, _zero_buffers
    from planner.reduction import NORM_CHUNK

    facts = _facts("Qwen/Qwen2.5-3B")  # tied: the embedding, 311M, is the largest tensor
    emb = facts.arch.embedding_params

    def reduction(s: Setup) -> tuple[float, float]:
        return _at_offloaded_gradient(facts, s, 2, _zero_buffers(facts, s, 2))

    z2 = _setup(zero_stage=2, offload_optimizer="cpu")
    buckets = _zero_buffers(facts, z2, 2).backward
    layer = 2048 * 11008  # the MLP's projections, the largest tensors of a layer
    # ZeRO-2, one GPU: a bucket reduced in backward takes an fp64 copy of a layer's gradient at a
    # time (the gradients are views of the bucket by then); the last one, after backward, the
    # embedding's, beside both buckets
    assert reduction(z2) == (8 * layer, 8 * emb + buckets)
    # two GPUs: only this rank's slice of each gradient
    z2x2 = z2.with_(num_gpus=2)
    assert reduction(z2x2) == (8 * layer, 8 * min(emb, facts.trainable_parameters / 2) + buckets)
    # ZeRO-3, two GPUs: the reduce-scatter output of a full bucket, a bf16 GPU copy of the partition,
    # and an fp64 copy of at most one norm chunk of it; NVMe also keeps the bucket's fp32 copies
    z3 = _setup(zero_stage=3, offload_optimizer="cpu", num_gpus=2)
    bucket = z3.knobs.reduce_bucket_size
    mid, end = reduction(z3)
    assert end == 2 * bucket / 2 + 2 * emb / 2 + 8 * min(emb / 2, NORM_CHUNK)
    assert mid < end
    assert reduction(z3.with_(offload_optimizer="nvme"))[1] == end + 4 * bucket / 2
    assert reduction(z3.with_(offload_optimizer="none")) == (0.0, 0.0)


def test_zero12_initialisation_flattens_beside_the_model_and_leaves_its_blocks_cached() -> None:
    """``DeepSpeedZeroOptimizer.__init__`` (stage_1_and_2.py): the flat copy of the trainable
    parameters is made on the GPU beside the model's own tensors, then this rank's partition of it
    is cloned on the GPU for the fp32 master; the model's per-parameter blocks and the clone's block
    stay cached. With the optimizer offloaded and overlap_comm, the fp64 norm copies on the
    reduction stream take blocks of their own: the first bucket's largest, then any larger; on
    several GPUs also the flat copy of a bucket that ``allreduce_bucket`` reduces."""
    from planner.memory import _initialization, _reduction_stream_blocks

    facts = _facts("Qwen/Qwen2.5-3B")  # tied: no head gradient comes first
    whole = 2 * facts.num_parameters
    emb = facts.arch.embedding_params
    layer = 2048 * 11008
    z2 = _setup(zero_stage=2, offload_optimizer="cpu")
    assert _initialization(facts, z2) == (2 * whole, 3 * whole)
    assert _initialization(facts, z2.with_(num_gpus=2)) == (2 * whole, 2.5 * whole)
    assert _reduction_stream_blocks(facts, z2, 2) == 8 * (layer + emb)
    bucket = z2.knobs.reduce_bucket_size
    per_rank = facts.trainable_parameters / 2
    two = _reduction_stream_blocks(facts, z2.with_(num_gpus=2), 2)
    assert two == 8 * (layer + min(emb, per_rank)) + 2 * bucket
    serial = z2.with_(knobs=replace(z2.knobs, overlap_comm=False))
    assert _reduction_stream_blocks(facts, serial, 2) == 0.0
    assert _reduction_stream_blocks(facts, z2.with_(offload_optimizer="none"), 2) == 0.0
    # ZeRO-0 and ZeRO-3 do not flatten the whole model
    assert _initialization(facts, z2.with_(zero_stage=3)) == (0.0, 0.0)

    untied = _facts("microsoft/Phi-3-mini-4k-instruct")  # the untied head's gradient is reduced first
    assert _reduction_stream_blocks(untied, z2, 2) == 8 * untied.arch.embedding_params
    # LoRA: only the adapters are flattened
    arch = arch_from_config(catalogue()["Qwen/Qwen2.5-3B"].config)
    lora = model_facts(arch, "lora", resolve_lora(arch, 16, ["q_proj", "v_proj"], 0.0), "bf16")
    flat = sum(t.numel * t.elem_bytes * t.copies for t in lora.tensors if t.trainable)
    base = sum(t.numel * t.elem_bytes * t.copies for t in lora.tensors)
    assert _initialization(lora, z2.with_(method="lora")) == (base + flat, base + 2 * flat)


NVME_PARAMS = {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "nvme"}


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B", "google/gemma-2-2b"])
def test_nvme_parameter_buffers_hold_the_largest_parameter_and_one_layer(name: str) -> None:
    """The swap buffers DeepSpeed gets for parameters on NVMe: each holds the model's largest tensor,
    and there is one for every tensor of a decoder layer that is not persistent, and one more; the
    counts are the real model's, built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = job(model={"name": name}, resources=NVME_PARAMS, hardware=hardware(nvme_gib=2000))
    spec["training"]["gradient_checkpointing"] = True
    made = plan(spec)
    block = made.deepspeed_config["zero_optimization"]["offload_param"]
    threshold = made.deepspeed_config["zero_optimization"]["stage3_param_persistence_threshold"]

    config = AutoConfig.for_model(**catalogue()[name].config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    largest = max(p.numel() for p in model.parameters())
    layer = model.model.layers[0]
    swapped = sum(p.numel() > threshold for p in layer.parameters())
    assert block["buffer_size"] == largest
    assert block["buffer_count"] == swapped + 1
    assert made.host.pinned_buffers_bytes >= block["buffer_count"] * block["buffer_size"] * 2


def test_nvme_parameter_buffers_the_user_sets_are_kept_or_refused() -> None:
    spec = job(model={"name": "Qwen/Qwen2.5-7B"}, resources=dict(NVME_PARAMS),
               hardware=hardware(nvme_gib=2000))
    embedding = 152064 * 3584
    spec["resources"]["deepspeed"] = {"offload_param": {"buffer_count": 12, "buffer_size": embedding + 1}}
    block = plan(spec).deepspeed_config["zero_optimization"]["offload_param"]
    assert (block["buffer_count"], block["buffer_size"]) == (12, embedding + 1)
    spec["resources"]["deepspeed"] = {"offload_param": {"buffer_size": 100_000_000}}
    with pytest.raises(PlanError) as err:
        plan(spec)
    assert err.value.field == "resources.deepspeed.offload_param.buffer_size"
    assert f"{embedding:,}" in err.value.message


def test_parameters_on_nvme_give_their_buffers_back_unless_the_spec_says_otherwise() -> None:
    """DeepSpeed's NVMe prefetch takes every free swap buffer for the parameters its trace expects
    next, and from the second step its coordinator keeps gathered every parameter used again within
    stage3_max_reuse_distance elements; the buffers hold one layer's tensors and one more only when
    every fetch is the demand of the module that runs and gives its buffer back after it (a
    Qwen2.5-1.5B LoRA job at reuse distance 1e9 failed its second step with eight buffers,
    bench/results/nvme-offload). Parameters on the CPU keep both."""
    spec = job(model={"name": "Qwen/Qwen2.5-1.5B"}, resources=dict(NVME_PARAMS),
               hardware=hardware(nvme_gib=2000))
    zero = plan(spec).deepspeed_config["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == 0
    assert zero["stage3_max_reuse_distance"] == 0
    on_cpu = job(model={"name": "Qwen/Qwen2.5-1.5B"}, resources=NVME_PARAMS | {"offload_param": "cpu"})
    cpu_zero = plan(on_cpu).deepspeed_config["zero_optimization"]
    assert cpu_zero["stage3_prefetch_bucket_size"] > 0 and cpu_zero["stage3_max_reuse_distance"] > 0
    spec["resources"]["deepspeed"] = {"stage3_prefetch_bucket_size": 50_000_000}
    pinned = plan(spec).deepspeed_config["zero_optimization"]
    assert pinned["stage3_prefetch_bucket_size"] == 50_000_000


def test_a_reuse_distance_with_parameters_on_nvme_needs_its_buffers_set() -> None:
    """A reuse distance the spec sets keeps parameters in swap buffers the planner does not size:
    with the parameters on NVMe as asked it is refused, naming the field, unless the spec sets the
    buffers too; where the planner picks the offload, it picks no NVMe point for it."""
    reuse = {"stage3_max_reuse_distance": 100_000_000}
    spec = job(model={"name": "Qwen/Qwen2.5-1.5B"}, resources=NVME_PARAMS | {"deepspeed": dict(reuse)},
               hardware=hardware(nvme_gib=2000))
    with pytest.raises(PlanError) as err:
        plan(spec)
    assert err.value.field == "resources.deepspeed.stage3_max_reuse_distance"
    spec["resources"]["deepspeed"] = reuse | {"offload_param": {"buffer_count": 200}}
    zero = plan(spec).deepspeed_config["zero_optimization"]
    assert zero["stage3_max_reuse_distance"] == 100_000_000 and zero["offload_param"]["buffer_count"] == 200
    # a 7B full fine-tune on a 24 GiB card with 64 GiB of host RAM: only NVMe holds its states
    auto = {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "auto", "offload_param": "auto"}
    big = job(model={"name": "Qwen/Qwen2.5-7B"}, method="full", resources=dict(auto),
              hardware=hardware(nvme_gib=2000, gpu_bytes=24 * GIB, host_gib=64))
    assert plan(big).resolved.offload_param == "nvme"
    big["resources"]["deepspeed"] = dict(reuse)
    assert plan(big).resolved.offload_param != "nvme"
