"""The calibration data file: every constant the estimator uses, with its evidence."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from planner import constants, plan, resolve_lora
from planner.calibration import CALIBRATION, KINDS, parse, trial
from tests.planner.support import H200_BYTES, TINY_CONFIGS

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
EVIDENCED = ("measured", "fitted", "count")


def test_the_constants_module_is_the_data_file() -> None:
    names = {n for n in vars(constants) if n.isupper() and not n.startswith("_")}
    names -= {"GIB", "CALIBRATION_RESULTS"}
    assert names == set(CALIBRATION.constants)
    for name, c in CALIBRATION.constants.items():
        assert getattr(constants, name) == c.value, name


@pytest.mark.parametrize("name", sorted(CALIBRATION.constants))
def test_every_measured_or_fitted_constant_names_its_records_and_hardware(name: str) -> None:
    c = CALIBRATION[name]
    assert c.kind in KINDS and c.unit and c.meaning
    if c.kind in EVIDENCED:
        assert c.hardware and c.records, f"{name} is {c.kind} but names no hardware or records"
    for record in c.records:
        file, _, job = record.partition(":")
        assert (RESULTS / file).exists(), f"{name}: bench/results/{file} does not exist"
        if job:  # one job of a field-case report (file:phase:job), as structural terms name them
            assert _named_jobs([record]), f"{name}: {record} names no job that ran"


def test_the_calibration_files_exist_and_every_other_record_is_held_out() -> None:
    assert CALIBRATION.calibration_files
    for name in CALIBRATION.calibration_files:
        assert (RESULTS / name).is_file(), name
    fitted = {r for c in CALIBRATION.constants.values() if c.kind == "fitted" for r in c.records}
    assert fitted <= set(CALIBRATION.calibration_files)


def test_a_trial_plans_with_other_values_and_restores_them() -> None:
    tiny_spec = {"model": {"config": TINY_CONFIGS["llama"]}, "method": "lora",
                 "hardware": {"gpu_count": 1, "gpu_memory_bytes": H200_BYTES,
                              "host_memory_bytes": 64 * 2**30}}
    before = plan(tiny_spec).per_gpu
    with trial(CUDA_CONTEXT_BYTES=2 * constants.CUDA_CONTEXT_BYTES):
        inside = plan(tiny_spec).per_gpu
    assert inside.cuda_context_bytes == 2 * before.cuda_context_bytes
    assert plan(tiny_spec).per_gpu.cuda_context_bytes == before.cuda_context_bytes
    with pytest.raises(KeyError, match="NOT_A_CONSTANT"), trial(NOT_A_CONSTANT=1.0):
        pass


def test_an_entry_of_unknown_kind_is_refused() -> None:
    raw = json.loads((Path(constants.__file__).parent / "data" / "calibration.json").read_text())
    raw["constants"]["MFU"]["kind"] = "guessed"
    with pytest.raises(ValueError, match="MFU: kind must be one of"):
        parse(raw)


def test_the_qlora_constants_are_what_the_kernel_records_measured() -> None:
    """The three QLoRA step-time figures are read off the rows of ``bench/qlora_kernels.py``."""
    rows = json.loads((RESULTS / CALIBRATION["QLORA_MATMUL_SLOWDOWN"].records[0]).read_text())["rows"]
    forward = [r["nf4_forward_host_s"] - r["bf16_forward_host_s"] for r in rows]
    backward = [(r["nf4_forward_backward_host_s"] - r["nf4_forward_host_s"])
                - (r["bf16_forward_backward_host_s"] - r["bf16_forward_host_s"]) for r in rows]
    gpu_bound = [r["nf4_forward_backward_s"] / r["bf16_forward_backward_s"] for r in rows
                 if r["bf16_forward_backward_s"] >= 1e-3]
    assert len(rows) == 60 and len(gpu_bound) == 6
    assert abs(constants.QLORA_LINEAR_FORWARD_HOST_S / statistics.median(forward) - 1) < 0.01
    assert abs(constants.QLORA_LINEAR_BACKWARD_HOST_S / statistics.median(backward) - 1) < 0.01
    assert abs(constants.QLORA_MATMUL_SLOWDOWN / statistics.median(gpu_bound) - 1) < 0.01


def test_the_masked_attention_constants_are_what_the_kernel_record_fits() -> None:
    """The masked SDPA call's rates, fixed cost and forward share are ``bench/attention_kernels.py``'s fit of
    its record, the rates as fractions of the card's matmul rate from the probe check of the same card."""
    from bench.attention_kernels import fit

    rows = json.loads((RESULTS / CALIBRATION["MASKED_ATTENTION_RATE"].records[0]).read_text())["rows"]
    probe = json.loads((RESULTS / "probe" / "nvidia-h100-2026-12-06.json").read_text())
    assert len(rows) == 30
    fitted = fit(rows, probe["plain"]["matmul_tflops"]["probe"])
    for name, key in (("MASKED_ATTENTION_RATE", "rate_fraction_128"),
                      ("MASKED_ATTENTION_RATE_WIDE_HEADS", "rate_fraction_256"),
                      ("MASKED_ATTENTION_CALL_SECONDS", "call_seconds"),
                      ("MASKED_ATTENTION_FORWARD_SHARE", "forward_share")):
        assert abs(getattr(constants, name) / fitted[key] - 1) < 0.005, name
        assert CALIBRATION[name].records == CALIBRATION["MASKED_ATTENTION_RATE"].records


def test_the_memory_bound_constants_and_mfu_are_what_the_kernel_record_fits() -> None:
    """Each kind's bytes per element and the matmuls' MFU are ``bench/step_kernels.py``'s fit of its
    record: the memory-bound kernels at the card's datasheet bandwidth, the matmul kernels against
    the rate the box's probe gave the planner in the same device call."""
    from bench.step_kernels import fit, matmul_efficiency
    from planner.hardware import find_card

    record = CALIBRATION["MEMORY_BYTES_LOGITS"].records[0]
    report = json.loads((RESULTS / record).read_text())
    card = find_card(report["device"])
    assert card is not None and len(report["rows"]) == 144
    fitted = fit(report["rows"], card.memory_bandwidth_gbps)
    names = [n for n in CALIBRATION.constants if n.startswith("MEMORY_BYTES_")]
    assert sorted(n.removeprefix("MEMORY_BYTES_").lower() for n in names) == sorted(fitted)
    for name in names:
        assert CALIBRATION[name].records == (record,)
        assert abs(getattr(constants, name) / fitted[name.removeprefix("MEMORY_BYTES_").lower()] - 1) < 0.005
    phase = json.loads((RESULTS / CALIBRATION["MFU"].records[1]).read_text())["phases"]["heldout8"]
    rate = phase["gpus"]["boxes"][0]["planned_from_probe"]["gpu_bf16_tflops"]
    assert abs(constants.MFU / matmul_efficiency(report["rows"], rate) - 1) < 0.005


Job = tuple[str, dict[str, object], dict[str, object]]


def _named_jobs(records: list[str] | tuple[str, ...]) -> list[Job]:
    """(ident, job record, box) of each field-case job that ``records`` name."""
    from bench.field_cases import measured_jobs, record_names

    files = sorted({RESULTS / r.partition(":")[0] for r in records})
    named = set(records)
    return [(ident, job, box) for ident, job, box in measured_jobs(files) if record_names(ident) & named]


def _structure_jobs(name: str) -> list[Job]:
    """(ident, job record, box) of each job a structural term names as its evidence."""
    return _named_jobs(next(s for s in CALIBRATION.structure if s.name == name).records)


def test_every_structural_term_names_records_that_exist() -> None:
    assert CALIBRATION.structure
    for term in CALIBRATION.structure:
        assert term.meaning and term.basis and term.records, term.name
        assert len(_structure_jobs(term.name)) == len(term.records), term.name


@pytest.mark.parametrize("ident", [i for i, _, _ in _structure_jobs("SDPA_MASKED_ROWS")])
def test_the_masked_rows_term_closes_its_records_allocated_peak(ident: str, tmp_path: Path) -> None:
    """Without the masked rows' terms these jobs' allocated peaks were planned 5-6% short; with
    them, within 2%."""
    from bench.field_cases import replan_spec

    _, job, box = next(j for j in _structure_jobs("SDPA_MASKED_ROWS") if j[0] == ident)
    spec = replan_spec(job, box, tmp_path)
    measured = job["torch_allocated_peak_bytes"]

    def allocated(s: dict[str, object]) -> float:
        g = plan(s).per_gpu
        return (max(g.forward_backward_bytes, g.optimizer_step_bytes) - measured) / measured

    one_sequence = {"num_rows": 1, "num_tokens": spec["training"]["seq_len"]}
    full_rows = {**spec, "dataset": {**spec["dataset"], **one_sequence}}
    assert abs(allocated(spec)) <= 0.02
    assert allocated(full_rows) < -0.04  # the same job planned as if no row carried a mask


@pytest.mark.parametrize("ident", [i for i, _, _ in _structure_jobs("PLANNED_ATTENTION")])
def test_a_plan_holds_the_attention_its_job_ran(ident: str, tmp_path: Path) -> None:
    from bench.field_cases import replan_spec

    _, job, box = next(j for j in _structure_jobs("PLANNED_ATTENTION") if j[0] == ident)
    spec = replan_spec(job, box, tmp_path)
    nvml = job["nvml_peak_bytes"]
    ran = plan(spec).per_gpu.total_bytes
    eager_spec = {**spec, "training": {**spec["training"], "attn_implementation": "eager"}}
    eager = plan(eager_spec).per_gpu.total_bytes
    assert -0.03 <= (ran - nvml) / nvml <= 0.10
    assert (eager - nvml) / nvml > 0.25  # the attention the trainer did not run


@pytest.mark.parametrize("ident", [i for i, _, _ in _structure_jobs("CHECKPOINT_SAVE_HOST")])
def test_the_checkpoint_save_is_what_a_run_adds_to_its_steps_host_memory(ident: str, tmp_path: Path) -> None:
    """The worker's peak RSS of a full fine-tune less the largest RSS the trainer reported at a step
    is the final checkpoint's save."""
    from bench.field_cases import replan

    _, job, box = next(j for j in _structure_jobs("CHECKPOINT_SAVE_HOST") if j[0] == ident)
    added = job["measured_host_rss_bytes"] - job["host_rss_peak_bytes"]
    assert replan(job, box, tmp_path).host.checkpoint_save_bytes == pytest.approx(added, rel=0.05)


@pytest.mark.parametrize("ident", [i for i, _, _ in _structure_jobs("UNFUSED_STEP_CACHE")])
def test_an_unfused_zero0_step_reserves_its_initialisation_and_the_loss_it_could_not_place(
        ident: str, tmp_path: Path) -> None:
    """These jobs peak at the optimizer step: the plan's reserved bytes there are torch's reserved
    peak, and the job's lease and allocator limit hold them (the allocator under a lower limit gives
    the blocks back, and NVML shows the limit: heldout17)."""
    from bench.field_cases import replan_spec

    _, job, box = next(j for j in _structure_jobs("UNFUSED_STEP_CACHE") if j[0] == ident)
    g = plan(replan_spec(job, box, tmp_path)).per_gpu
    reserved = job["torch_reserved_peak_bytes"]
    assert g.peak_phase == "optimizer_step"
    assert abs((g.total_bytes - g.cuda_context_bytes) - reserved) / reserved <= 0.03
    assert g.required_bytes == g.total_bytes


def test_the_segments_an_unfused_step_adds_are_the_loss_blocks_it_could_not_place() -> None:
    """The allocator's history of the trace the term came from: every segment created after
    initialisation is one of the loss's blocks, and the plan counts exactly those."""
    trace_dir = RESULTS / "alloc-trace"
    case = "llama-3.2-3b|full|z0|off=none|ckpt|s4096|mb2|g1|o=sgd"
    records = (json.loads(line) for line in
               (trace_dir / "nvidia-h100-2026-12-07-trace-unfused.jsonl").read_text().splitlines())
    record = next(r for r in records if r["case"] == case)
    trace_file = "llama-3.2-3b_full_z0_off_none_ckpt_s4096_mb2_g1_o_sgd-alloc-trace-rank0.json"
    trace = json.loads((trace_dir / trace_file).read_text())
    # initialisation's allocated peak is its optimizer step on the zero gradients, after its last segment
    initialised = next(p["event"] for p in trace["phases"] if p["phase"] == "before the first mark")
    added = sum(s["segment_bytes"] for s in trace["segment_allocs"] if s["event"] > initialised)
    g = plan(record["spec"]).per_gpu
    assert g.total_bytes - g.cuda_context_bytes - g.optimizer_step_bytes == pytest.approx(added, rel=0.01)
    assert g.optimizer_step_bytes == pytest.approx(record["measured"]["torch_max_allocated_bytes"], rel=0.01)


def test_the_checkpointed_forward_takes_the_segments_the_plan_counts() -> None:
    """The allocator's history of the trace the term came from: between the first intermediate-sized
    segment of the forward and the loss's first vocabulary-sized one, the forward took exactly the
    blocks of the MLP intermediate that the plan counts, and their free bytes are the term's."""
    from planner.arch import arch_from_config
    from planner.facts import model_facts
    from planner.memory import _FP32, _checkpoint_segments_beside_the_loss, _largest_trainable
    from planner.setup import Setup

    trace_dir = RESULTS / "alloc-trace"
    records = (json.loads(line) for line in
               (trace_dir / "nvidia-h100-2026-12-07-trace-long-rows.jsonl").read_text().splitlines())
    record = next(r for r in records if r["case"].startswith("llama-3.2-3b|qlora|z0"))
    trace_file = "llama-3.2-3b_qlora_z0_off_none_ckpt_s2048_mb8_g1_t_all-alloc-trace-rank0.json"
    trace = json.loads((trace_dir / trace_file).read_text())
    spec = record["spec"]
    arch = arch_from_config(spec["model"]["config"])
    tokens = spec["training"]["micro_batch_size"] * spec["training"]["seq_len"]
    intermediate, hidden = 2 * tokens * arch.intermediate_size, 2 * tokens * arch.hidden_size
    vocabulary = 2 * tokens * arch.vocab_size
    sizes = [s["segment_bytes"] for s in trace["segment_allocs"]]
    forward = sizes[sizes.index(intermediate):next(i for i, b in enumerate(sizes) if b >= vocabulary)]
    assert set(forward) == {intermediate} and len(forward) == 16  # 28 layers, two checkpoints a block, +2

    lora = resolve_lora(arch, 16, spec["lora"]["target_modules"], 0.0)
    facts = model_facts(arch, "qlora", lora, "bf16")
    setup = Setup(method="qlora", num_gpus=1, zero_stage=0, offload_optimizer="none", offload_param="none",
                  micro_batch_size=8, gradient_accumulation_steps=1, seq_len=2048,
                  gradient_checkpointing=True, precision="bf16", optimizer="adamw")
    held = _FP32 * _largest_trainable(facts)  # the adapters' largest gradient block
    counted = _checkpoint_segments_beside_the_loss(facts, setup, 2, 0.0, at_loss=0.0, allocated=0.0)
    assert counted + held == len(forward) * intermediate - arch.num_layers * hidden


def test_zero2_reserves_beside_its_initialisation_what_the_loss_and_the_head_could_not_place() -> None:
    """The allocator's history the term came from (``ZERO12_INITIALIZATION_CACHE``): after
    initialisation, the default stream took exactly the segments the plan counts beside its cache
    (the fp32 logits' block and the LM head's weight gradient's), and the reduction stream the fp64
    norm copies of a layer's and of the tied embedding's gradients. ZeRO-2's two buckets lived in
    the clone's cached block and went back to it: with initialisation's cache these segments are the
    trace's reserved peak, and so is the plan."""
    from planner.arch import arch_from_config
    from planner.facts import model_facts
    from planner.memory import _beside_initialization_cache, _reduction_stream_blocks, estimate_memory
    from planner.setup import Setup

    trace_dir = RESULTS / "alloc-trace"
    records = [json.loads(line) for line in
               (trace_dir / "nvidia-h200-x2-2026-11-30-trace-zero2-offload-2.jsonl").read_text().splitlines()]
    record = next(r for r in records if r["case"].startswith("llama-3.2-1b|full|z2|off=opt"))
    trace_file = "llama-3.2-1b_full_z2_off_opt_ckpt_s2048_mb1_g1-emcrou9o-alloc-trace-rank0.json"
    trace = json.loads((trace_dir / trace_file).read_text())
    initialised = next(p["event"] for p in trace["phases"] if p["phase"] == "initialised")
    # the small pools' 2 and 20 MiB segments are the fixed slack's
    later = [s for s in trace["segment_allocs"]
             if s["event"] > initialised and s["segment_bytes"] > 20 * 2**20]

    def norm_copy(segment: dict[str, Any]) -> bool:  # ZeRO-1/2's fp64 copy on the reduction stream
        return "set_norm_for_param_grad_in_gpu" in " ".join(segment["where"][:1])

    on_stream = [s["segment_bytes"] for s in later if norm_copy(s)]
    beside = [s["segment_bytes"] for s in later if not norm_copy(s)]
    assert len(on_stream) == 2 and len(beside) == 2

    facts = model_facts(arch_from_config(record["spec"]["model"]["config"]), "full", None, "bf16")
    setup = Setup(method="full", num_gpus=1, zero_stage=2, offload_optimizer="cpu", offload_param="none",
                  micro_batch_size=1, gradient_accumulation_steps=1, seq_len=2048,
                  gradient_checkpointing=True, precision="bf16", optimizer="adamw")
    assert _beside_initialization_cache(facts, setup, 2) == pytest.approx(sum(beside), rel=0.01)
    assert _reduction_stream_blocks(facts, setup, 2) == pytest.approx(sum(on_stream), rel=0.01)
    # the buckets took no segment of their own: the clone's cached block held them
    assert not [s for s in trace["segment_allocs"] if "setup_buckets" in " ".join(s["where"])]
    estimate = estimate_memory(facts, setup)
    reserved = estimate.total_bytes - estimate.cuda_context_bytes
    assert estimate.initialization_reserved_bytes == reserved
    assert reserved == pytest.approx(record["measured"]["torch_max_reserved_bytes"], rel=0.01)


#: the reduction stream's allocation sites in DeepSpeed 0.19's stage3.py and coalesced_collectives.py
_REDUCTION_SITES = ("reduce_scatter_coalesced", "partition_grads", "_constant_buffered_norm2")


@pytest.mark.parametrize("trace_file", [
    "qwen2.5-1.5b_full_z3_off_opt_ckpt_s2048_mb2_g1-alloc-trace-rank0.json",
    "llama-3.2-1b_full_z3_off_opt_param_ckpt_s2048_mb4_g1-alloc-trace-rank0.json",
    "llama-3.2-3b_full_z3_off_opt_param_ckpt_s4096_mb2_g1-alloc-trace-rank0.json",
])
def test_the_reduction_stream_takes_the_segments_its_replay_gives(trace_file: str) -> None:
    """The allocator's histories the term came from (``ZERO3_REDUCTION_STREAM``): the segments created
    at DeepSpeed's reduction sites are the ones the replay of ZeRO-3's buckets through the caching
    allocator creates: a bucket's flat copy, each larger gradient copy and fp64 chunk, and a second
    flat copy where a later bucket is larger than the first (Llama 3.2 3B)."""
    from planner.arch import arch_from_config
    from planner.reduction import segments

    trace_dir = RESULTS / "alloc-trace"
    records = [json.loads(line) for line in
               (trace_dir / "nvidia-h100-2026-12-07-trace-z3-offload.jsonl").read_text().splitlines()]
    model = trace_file.split("_", 1)[0]
    record = next(r for r in records if r["case"].startswith(model + "|full|z3"))
    trace = json.loads((trace_dir / trace_file).read_text())
    traced = [s["segment_bytes"] for s in trace["segment_allocs"]
              if any(site in " ".join(s["where"][:3]) for site in _REDUCTION_SITES)]
    arch = arch_from_config(record["spec"]["model"]["config"])
    assert sorted(segments(arch, None, 2, 1, 500_000_000)) == sorted(traced)


def test_the_slack_counts_the_reduction_stream_under_zero3_with_the_optimizer_on_the_cpu() -> None:
    """The term replaces the fitted gradient blocks for ZeRO-3 with the optimizer on the CPU and only
    there: the same job with the optimizer on the GPU keeps them."""
    from planner.arch import arch_from_config
    from planner.catalogue import lookup
    from planner.reduction import reserved_bytes

    config = lookup("meta-llama/Llama-3.2-1B").config
    spec = {"model": {"config": config}, "method": "full",
            "training": {"micro_batch_size": 2, "seq_len": 1024, "gradient_checkpointing": True},
            "hardware": {"gpu_count": 1, "gpu_memory_bytes": H200_BYTES, "host_memory_bytes": 512 * 2**30}}
    on_cpu = {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "none"}
    on_gpu = {**on_cpu, "offload_optimizer": "none"}
    cpu = plan({**spec, "resources": on_cpu}).per_gpu.allocator_slack_bytes
    gpu = plan({**spec, "resources": on_gpu}).per_gpu.allocator_slack_bytes
    arch = arch_from_config(config)
    largest = 4 * arch.vocab_size * arch.hidden_size
    stream = reserved_bytes(arch, None, 2, 1, 500_000_000)
    assert cpu - gpu == pytest.approx(stream - constants.ALLOCATOR_LARGEST_GRADIENT_BLOCKS * largest, abs=2)
