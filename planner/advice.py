"""Warnings and advice in the field report's spirit.

The ladder: a gap under ~30% is closed with gradient checkpointing and accumulation before any
offload; offload is for large gaps; NVMe is the last resort. fp32 weights loaded by mistake and
evaluation's KV cache are the silent killers.

Every advice entry proposes one value for one field that the plan does not already have, and
says what planning that change saves (GPU bytes, step seconds); a change that saves nothing is
not advised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.constants import GIB
from planner.evaluation import EvalMemory
from planner.memory import ModelFacts
from planner.models import Note
from planner.search import LEAN_STAGE3, MIN_REDUCE_BUCKET, Bounds, Candidate
from planner.setup import Setup

__all__ = ["Context", "advise", "warn"]

_LADDER_GAP = 0.30


@dataclass(frozen=True, slots=True)
class Context:
    facts: ModelFacts
    chosen: Candidate
    bounds: Bounds
    eval_memory: EvalMemory
    eval_enabled: bool
    config_dtype_field: str | None  # where the config's torch_dtype was read, if it says float32
    #: plans one change of the chosen setup (same model, same box)
    evaluate: Callable[[Setup], Candidate]
    #: the evaluation process's memory at a given eval batch size
    eval_at: Callable[[int], EvalMemory]
    eval_batch_size: int
    micro_batch_pinned: bool


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
    if s.micro_batch_size == 1 and s.gradient_accumulation_steps > 1 and ctx.micro_batch_pinned:
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


def advise(ctx: Context, fits: bool) -> list[Note]:
    notes: list[Note] = []
    if not fits and ctx.chosen.memory.required_bytes > ctx.bounds.gpu_usable:
        notes += _memory_levers(ctx)
    notes += _bucket_advice(ctx)
    notes += _zero3_single_gpu(ctx)
    notes += _zero3_gathered(ctx)
    notes += _eval_advice(ctx)
    return notes


def _seconds(x: float) -> str:
    return f"{x:.3g} s"


def _change(ctx: Context, code: str, field: str, value: object, changed: Setup, what: str) -> Note | None:
    """Advice to set ``field`` to ``value`` (``changed``: the chosen setup with it), if planning
    the change saves GPU memory; the note carries what it saves and costs."""
    before, after = ctx.chosen, ctx.evaluate(changed)
    saved = before.memory.required_bytes - after.memory.required_bytes
    if saved <= 0:
        return None
    dt = before.speed.step_seconds - after.speed.step_seconds
    fits = " and fits" if after.fits and not before.fits else ""
    return Note(
        code=code,
        field=field,
        value=value,
        saves_bytes=saved,
        saves_seconds=round(dt, 6),
        message=(
            f"{what} frees {_gib(saved)} per GPU{fits} "
            f"({_gib(after.memory.required_bytes)} of {_gib(ctx.bounds.gpu_usable)} usable); "
            f"step {_seconds(before.speed.step_seconds)} -> {_seconds(after.speed.step_seconds)}"
        ),
    )


def _levers(s: Setup) -> list[tuple[str, object, Setup, str]]:
    """The ladder's one-field memory savers that the setup does not already use, cheapest first."""
    out: list[tuple[str, object, Setup, str]] = []
    if not s.gradient_checkpointing:
        out.append(("training.gradient_checkpointing", True, s.with_(gradient_checkpointing=True),
                    "gradient checkpointing"))
    if s.micro_batch_size > 1:
        micro = max(d for d in range(1, s.micro_batch_size) if s.micro_batch_size % d == 0)
        accum = s.gradient_accumulation_steps * s.micro_batch_size // micro
        out.append(("training.micro_batch_size", micro,
                    s.with_(micro_batch_size=micro, gradient_accumulation_steps=accum),
                    f"micro-batch {micro} with accumulation {accum} (the same global batch)"))
    if s.zero_stage < 3:
        stage = s.zero_stage + 1
        out.append(("resources.zero_stage", stage, s.with_(zero_stage=stage), f"ZeRO stage {stage}"))
    if s.offload_optimizer == "none" and s.zero_stage > 0 and s.optimizer != "adamw_8bit":
        out.append(("resources.offload_optimizer", "cpu", s.with_(offload_optimizer="cpu"),
                    "optimizer offload to the CPU"))
    if s.offload_param == "none" and s.zero_stage == 3:
        out.append(("resources.offload_param", "cpu", s.with_(offload_param="cpu"),
                    "parameter offload to the CPU"))
    return out


def _memory_levers(ctx: Context) -> list[Note]:
    usable = ctx.bounds.gpu_usable
    gap = ctx.chosen.memory.required_bytes / usable - 1
    code = "ladder_small_gap" if gap < _LADDER_GAP else "ladder_large_gap"
    notes: list[Note] = []
    for field, value, changed, what in _levers(ctx.chosen.setup):
        note = _change(ctx, code, field, value, changed, f"{gap:.0%} over the GPU: {what}")
        if note is not None:
            notes.append(note)
    return notes


def _bucket_advice(ctx: Context) -> list[Note]:
    s, t = ctx.chosen.setup, ctx.facts.trainable_parameters
    size = max(t, MIN_REDUCE_BUCKET)
    if s.zero_stage == 0 or not s.knobs.contiguous_gradients or s.knobs.reduce_bucket_size <= size:
        return []
    note = _change(
        ctx,
        "reduce_bucket_oversized",
        "resources.deepspeed.reduce_bucket_size",
        size,
        s.with_(knobs=replace(s.knobs, reduce_bucket_size=size)),
        f"reduce_bucket_size {s.knobs.reduce_bucket_size:.2e} exceeds the {t:,} trainable parameters; "
        f"{size:.2e}",
    )
    return [note] if note is not None else []


def _zero3_single_gpu(ctx: Context) -> list[Note]:
    s, c = ctx.chosen.setup, ctx.chosen
    alone = s.num_gpus == 1 and s.offload_param == "none" and s.offload_optimizer == "none"
    if not (s.zero_stage == 3 and alone):
        return []
    stage2 = ctx.evaluate(s.with_(zero_stage=2))
    if not stage2.fits or stage2.speed.step_seconds >= c.speed.step_seconds:
        return []
    dt = c.speed.step_seconds - stage2.speed.step_seconds
    return [
        Note(
            code="zero3_single_gpu",
            field="resources.zero_stage",
            value=2,
            saves_bytes=c.memory.required_bytes - stage2.memory.required_bytes,
            saves_seconds=round(dt, 6),
            message=(
                "ZeRO-3 on one GPU without offload partitions nothing and adds hook overhead: stage 2 "
                f"fits ({_gib(stage2.memory.required_bytes)} of {_gib(ctx.bounds.gpu_usable)}) and "
                f"saves {_seconds(dt)} per step"
            ),
        )
    ]


def _zero3_gathered(ctx: Context) -> list[Note]:
    s, mem = ctx.chosen.setup, ctx.chosen.memory
    lean = LEAN_STAGE3["max_reuse_distance"]
    if mem.gathered_parameters_bytes <= 0.1 * ctx.bounds.gpu_usable or s.knobs.max_reuse_distance <= lean:
        return []
    note = _change(
        ctx,
        "zero3_gathered",
        "resources.deepspeed.stage3_max_reuse_distance",
        lean,
        s.with_(knobs=replace(s.knobs, max_reuse_distance=lean)),
        f"{_gib(mem.gathered_parameters_bytes)} of gathered parameters stay live between uses; "
        f"stage3_max_reuse_distance {lean:.0e} (more all-gathers, not in the planned step time)",
    )
    return [note] if note is not None else []


def _eval_advice(ctx: Context) -> list[Note]:
    if not ctx.eval_enabled or ctx.eval_batch_size == 1:
        return []
    one = ctx.eval_at(1)
    saved = ctx.eval_memory.total_bytes - one.total_bytes
    if saved <= 0:
        return []
    return [
        Note(
            code="eval_separate",
            field="eval.batch_size",
            value=1,
            saves_bytes=saved,
            message=(
                f"evaluation runs in its own process, {_gib(ctx.eval_memory.total_bytes)} at eval.batch_size "
                f"{ctx.eval_batch_size}; batch size 1 frees {_gib(saved)} of it where the GPU is shared"
            ),
        )
    ]
