"""Warnings and advice in the field report's spirit.

The ladder: a gap under ~30% is closed with gradient checkpointing and accumulation before any
offload; offload is for large gaps; NVMe is the last resort. Long sequences past the trained
context, fp32 weights loaded by mistake and evaluation's KV cache are the silent killers.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.evaluation import EvalMemory
from planner.memory import ModelFacts
from planner.models import Note
from planner.search import Bounds, Candidate

__all__ = ["Context", "advise", "warn"]

GIB = 1024**3
_LADDER_GAP = 0.30


@dataclass(frozen=True, slots=True)
class Context:
    facts: ModelFacts
    chosen: Candidate
    bounds: Bounds
    eval_memory: EvalMemory
    eval_enabled: bool
    config_dtype_field: str | None  # where the config's torch_dtype was read, if it says float32
    num_gpus_requested: int | None


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def warn(ctx: Context) -> list[Note]:
    s, mem, arch = ctx.chosen.setup, ctx.chosen.memory, ctx.facts.arch
    notes: list[Note] = []
    if s.seq_len > arch.max_position_embeddings:
        notes.append(
            Note(
                code="seq_len_beyond_context",
                field="training.seq_len",
                message=(
                    f"seq_len {s.seq_len} exceeds the model's trained context "
                    f"({arch.max_position_embeddings} "
                    "positions): RoPE past its range degrades outputs; pick a long-context base or shorten"
                ),
            )
        )
    if s.precision == "fp32":
        notes.append(
            Note(
                code="fp32_weights",
                field="training.precision",
                message=(
                    "fp32 training doubles weights, gradients and activations versus bf16; use bf16 on Hopper"
                ),
            )
        )
    elif ctx.config_dtype_field is not None:
        notes.append(
            Note(
                code="fp32_weights",
                field=ctx.config_dtype_field,
                message=(
                    "the config says float32: load with torch_dtype=bfloat16, or the weights take twice the "
                    "memory before DeepSpeed casts them"
                ),
            )
        )
    if ctx.num_gpus_requested is not None and ctx.num_gpus_requested > ctx.bounds.gpu_count:
        notes.append(
            Note(
                code="num_gpus_exceeds_box",
                field="resources.num_gpus",
                message=(f"{ctx.num_gpus_requested} GPUs asked, the box has {ctx.bounds.gpu_count}"),
            )
        )
    if mem.host.total_bytes > ctx.bounds.host_usable:
        notes.append(
            Note(
                code="host_ram_short",
                field="resources.offload_optimizer",
                message=(
                    f"host RAM needed {_gib(mem.host.total_bytes)} exceeds the usable "
                    f"{_gib(ctx.bounds.host_usable)}"
                    " of the box: offload less, use more GPUs, or use LoRA"
                ),
            )
        )
    if mem.nvme_bytes > ctx.bounds.nvme_bytes:
        notes.append(
            Note(
                code="nvme_short",
                field="resources.offload_param",
                message=(
                    f"NVMe offload needs {_gib(mem.nvme_bytes)}, the box has {_gib(ctx.bounds.nvme_bytes)}"
                ),
            )
        )
    notes += _slow_offload(ctx)
    if ctx.eval_enabled and ctx.eval_memory.total_bytes > ctx.bounds.gpu_usable:
        notes.append(
            Note(
                code="eval_memory",
                field="eval.max_new_tokens",
                message=(
                    f"evaluation needs {_gib(ctx.eval_memory.total_bytes)} (KV cache "
                    f"{_gib(ctx.eval_memory.kv_cache_bytes)}, logits {_gib(ctx.eval_memory.logits_bytes)}) "
                    "on one GPU: lower eval.batch_size or max_new_tokens"
                ),
            )
        )
    if arch.model_type == "gemma2" and s.attn_implementation == "eager":
        notes.append(
            Note(
                code="gemma2_eager_attention",
                field="training.attn_implementation",
                message=(
                    "Gemma 2 trains with eager attention (its logit soft-capping has no SDPA path in "
                    "recent transformers), which stores seq^2 scores per head: long sequences cost "
                    "quadratically"
                ),
            )
        )
    return notes


def _slow_offload(ctx: Context) -> list[Note]:
    s, speed = ctx.chosen.setup, ctx.chosen.speed
    if s.offload_optimizer == "none" and s.offload_param == "none":
        return []
    notes: list[Note] = []
    share = speed.offload_seconds / speed.step_seconds if speed.step_seconds else 0.0
    if share > 0.5:
        notes.append(
            Note(
                code="offload_slow",
                field="resources.offload_optimizer",
                message=(
                    f"offload takes {share:.0%} of each step: use a larger micro-batch with accumulation, "
                    "Lion (cheaper on the CPU), or more GPUs"
                ),
            )
        )
    if s.micro_batch_size == 1 and s.gradient_accumulation_steps > 1:
        notes.append(
            Note(
                code="offload_small_micro_batch",
                field="training.micro_batch_size",
                message=(
                    "with offload a micro-batch of 1 leaves PCIe traffic dominant; raise it and "
                    "lower accumulation"
                ),
            )
        )
    if "nvme" in (s.offload_optimizer, s.offload_param):
        notes.append(
            Note(
                code="nvme_offload",
                field="resources.offload_param",
                message=(
                    "NVMe offload is the last resort: expect steps many times slower; a smaller "
                    "base model or "
                    "QLoRA is usually the better trade"
                ),
            )
        )
    return notes


def advise(ctx: Context, fits: bool, auto_filled: bool) -> list[Note]:
    s, mem = ctx.chosen.setup, ctx.chosen.memory
    notes: list[Note] = []
    usable = ctx.bounds.gpu_usable
    if not fits and mem.required_bytes > usable:
        gap = mem.required_bytes / usable - 1
        if gap < _LADDER_GAP:
            notes.append(
                Note(
                    code="ladder_small_gap",
                    field="training.gradient_checkpointing",
                    message=(
                        f"{gap:.0%} over the GPU: close it with gradient checkpointing and a "
                        "smaller micro-batch "
                        "with more accumulation before any offload"
                    ),
                )
            )
        else:
            notes.append(
                Note(
                    code="ladder_large_gap",
                    field="resources.offload_optimizer",
                    message=(
                        f"{gap:.0%} over the GPU: a gap this large needs ZeRO-3 across GPUs or CPU offload; "
                        "NVMe only if host RAM is short too"
                    ),
                )
            )
    if auto_filled and s.gradient_checkpointing and s.offload_optimizer == s.offload_param == "none":
        notes.append(
            Note(
                code="checkpointing_chosen",
                field="training.gradient_checkpointing",
                message=(
                    "gradient checkpointing was chosen over offload: ~30% more compute, no PCIe traffic"
                ),
            )
        )
    notes += _bucket_advice(ctx)
    if s.zero_stage == 3 and s.num_gpus == 1 and s.offload_param == "none" and s.offload_optimizer == "none":
        notes.append(
            Note(
                code="zero3_single_gpu",
                field="resources.zero_stage",
                message=(
                    "ZeRO-3 on one GPU without offload partitions nothing and adds hook "
                    "overhead; stage 2 holds "
                    "the same states"
                ),
            )
        )
    if mem.gathered_parameters_bytes > 0.1 * usable:
        notes.append(
            Note(
                code="zero3_gathered",
                field="resources.deepspeed.stage3_max_reuse_distance",
                message=(
                    f"{_gib(mem.gathered_parameters_bytes)} of gathered parameters stay live "
                    "between forward and "
                    "backward; a smaller stage3_max_reuse_distance / stage3_max_live_parameters frees it at "
                    "the cost of more all-gathers"
                ),
            )
        )
    if ctx.eval_enabled:
        notes.append(
            Note(
                code="eval_separate",
                field="eval",
                message=(
                    f"evaluation runs in its own process (about {_gib(ctx.eval_memory.total_bytes)}); keep "
                    "max_new_tokens small and batch_size 1 if the GPU is shared"
                ),
            )
        )
    return notes


def _bucket_advice(ctx: Context) -> list[Note]:
    s, t = ctx.chosen.setup, ctx.facts.trainable_parameters
    if s.zero_stage == 0 or not s.knobs.contiguous_gradients or s.knobs.reduce_bucket_size <= 2 * t:
        return []
    buffers = 2 if s.knobs.overlap_comm and s.zero_stage < 3 else 1
    saved = buffers * (s.knobs.reduce_bucket_size - max(t, 1_000_000)) * 2
    return [
        Note(
            code="reduce_bucket_oversized",
            field="resources.deepspeed.reduce_bucket_size",
            message=(
                f"reduce_bucket_size {s.knobs.reduce_bucket_size:.0e} exceeds the {t:,} "
                "trainable parameters; "
                f"setting it to {max(t, 1_000_000):.0e} frees {_gib(saved)} per GPU"
            ),
        )
    ]
