"""``plan(spec)``: from a job spec to a typed plan."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from planner.advice import Context, advise, warn
from planner.arch import Arch, arch_from_config
from planner.catalogue import lookup
from planner.constants import GIB
from planner.dsconfig import _INT_KNOBS as INT_KNOB_FIELDS
from planner.dsconfig import PinnedDeepSpeed, build_deepspeed_config, parse_pinned
from planner.errors import PlanError
from planner.evaluation import EvalMemory, estimate_eval
from planner.facts import model_facts
from planner.hardware import ResolvedHardware, planned_hardware, resolve_hardware
from planner.lora import LoraTargets, resolve_lora
from planner.memory import ModelFacts, moment_bytes_per_param
from planner.models import (
    Alternative,
    DiskUsage,
    EvalEstimate,
    HostMemory,
    ModelSummary,
    Note,
    NvmeUsage,
    PerGpuMemory,
    Plan,
    Resolved,
)
from planner.search import (
    Bounds,
    Candidate,
    Choices,
    Found,
    all_choices,
    changes_between,
    distinct_changes,
    evaluate,
    fixes_found,
    knob_variants,
    non_dominated,
    on_nvme,
    search,
)
from planner.setup import OffloadDevice, Setup
from planner.spec import AUTO, HardwareSpec, JobSpec
from planner.speed import GpuRates

__all__ = ["load_model_config", "plan", "prepare"]

_ALTERNATIVES = 5


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated spec with the model resolved: what the search and estimators need."""

    spec: JobSpec
    arch: Arch
    facts: ModelFacts
    source: str | None
    config_dtype_field: str | None
    pinned: PinnedDeepSpeed
    bounds: Bounds
    rates: GpuRates
    hardware: HardwareSpec
    figures: ResolvedHardware


def _as_spec(spec: JobSpec | Mapping[str, Any]) -> JobSpec:
    if isinstance(spec, JobSpec):
        return spec
    try:
        return JobSpec.model_validate(dict(spec))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "spec"
        raise PlanError(field, first["msg"]) from exc


def load_model_config(spec: JobSpec) -> tuple[dict[str, Any], str, str | None]:
    """(config dict, spec location for errors, source) of ``spec.model``."""
    ref = spec.model
    if ref.config is not None:
        return ref.config, "model.config", None
    if ref.name is not None:
        entry = lookup(ref.name)
        return entry.config, "model.name", entry.source
    assert ref.path is not None
    path = Path(ref.path) / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PlanError("model.path", f"{ref.path!r} has no config.json") from exc
    except OSError as exc:
        raise PlanError("model.path", f"cannot read {path}: {exc.strerror}") from exc
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError("model.path", f"{path} is not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    if not isinstance(config, dict):
        raise PlanError("model.path", f"{path} does not hold a JSON object")
    return config, "model.path:config.json", str(path)


WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _largest_weight_file(spec: JobSpec) -> int | None:
    """Bytes of the largest weight file in ``model.path`` (None without a folder or weight files)."""
    if spec.model.path is None:
        return None
    try:
        sizes = [
            entry.stat().st_size
            for entry in Path(spec.model.path).iterdir()
            if entry.is_file() and entry.name.endswith(WEIGHT_FILE_SUFFIXES)
        ]
    except OSError:
        return None
    return max(sizes) if sizes else None


def _fp32_dtype_field(config: Mapping[str, Any], where: str) -> str | None:
    for key in ("torch_dtype", "dtype"):
        if config.get(key) == "float32":
            return f"{where}.{key}" if where == "model.config" else where
    return None


# One Arch per model config, and one LoRA target set and one ModelFacts per (Arch, settings): the
# estimators memoise per-model results on these objects (compared by identity), so a model planned
# again, by another request or another search, reuses them.


@lru_cache(maxsize=256)
def _arch(config_json: str, where: str) -> Arch:
    return arch_from_config(json.loads(config_json), where)


@lru_cache(maxsize=1024)
def _lora(arch: Arch, r: int, targets: tuple[str, ...], dropout: float) -> LoraTargets:
    return resolve_lora(arch, r, targets, dropout)


@lru_cache(maxsize=1024)
def _facts(arch: Arch, method: str, lora: LoraTargets | None, precision: str,
           shard: int | None) -> ModelFacts:
    return model_facts(arch, method, lora, precision, shard)


def prepare(spec_in: JobSpec | Mapping[str, Any], hardware: HardwareSpec | None = None) -> Prepared:
    spec = _as_spec(spec_in)
    given = spec.hardware or hardware
    if given is None:
        raise PlanError(
            "hardware", "no hardware given: set spec.hardware or plan on a box with a known inventory"
        )
    figures = resolve_hardware(given, spec.training.precision.value)
    hw = figures.spec
    assert hw.gpu_memory_bytes is not None
    config, where, source = load_model_config(spec)
    try:
        arch = _arch(json.dumps(config, sort_keys=True), where)
    except PlanError as exc:
        if where == "model.config":
            raise
        # The spec names a folder or a catalogue entry; say which config.json key is wrong.
        key = exc.field.removeprefix(where + ".")
        raise PlanError(where.split(":")[0], f"config.json {key}: {exc.message}") from exc
    lora = None
    if spec.method.value in ("lora", "qlora"):
        lora = _lora(arch, spec.lora.r, tuple(spec.lora.target_modules), spec.lora.dropout)
    shard = _largest_weight_file(spec)
    facts = _facts(arch, spec.method.value, lora, spec.training.precision.value, shard)
    pinned = parse_pinned(spec.resources.deepspeed)
    nvme_bytes = 0 if hw.nvme_unavailable else hw.nvme_bytes
    bounds = Bounds(hw.gpu_count, hw.gpu_memory_bytes, hw.host_memory_bytes, nvme_bytes,
                    figures.gpu_memory_correction.value)
    rates = GpuRates(
        flops=figures.gpu_flops.value,
        pcie_bytes_per_s=figures.pcie_bytes_per_s.value,
        memory_bytes_per_s=figures.gpu_memory_bandwidth.value,
        step_time_factor=figures.step_time_factor.value,
        host_clock_factor=figures.host_clock_factor.value,
    )
    _refuse_unavailable_nvme(spec, pinned, hw)
    _refuse_small_swap_buffer(pinned, arch.largest_param)
    _refuse_what_the_box_cannot_run(spec, hw)
    dtype_field = _fp32_dtype_field(config, where)
    return Prepared(spec, arch, facts, source, dtype_field, pinned, bounds, rates, hw, figures)


def _refuse_unavailable_nvme(spec: JobSpec, pinned: PinnedDeepSpeed, hw: HardwareSpec) -> None:
    """A spec that asks for NVMe offload on a box where it cannot run is refused, with the reason."""
    if hw.nvme_unavailable is None:
        return
    why = f"NVMe offload cannot run on this box: {hw.nvme_unavailable}"
    for target in ("offload_optimizer", "offload_param"):
        asked = getattr(spec.resources, target)
        if str(getattr(asked, "value", asked)) == "nvme":
            raise PlanError(f"resources.{target}", why)
        if getattr(pinned, target).get("device") == "nvme":
            raise PlanError(f"resources.deepspeed.{target}.device", why)


def _refuse_small_swap_buffer(pinned: PinnedDeepSpeed, largest_param: int) -> None:
    """DeepSpeed swaps each parameter from NVMe whole into one buffer: one smaller than the model's
    largest parameter fails the job when its model loads."""
    size = pinned.offload_param.get("buffer_size")
    if size is not None and int(size) < largest_param:
        raise PlanError(
            "resources.deepspeed.offload_param.buffer_size",
            f"must hold the model's largest parameter, {largest_param:,} elements; got {int(size):,}",
        )


def _refuse_what_the_box_cannot_run(spec: JobSpec, hw: HardwareSpec) -> None:
    """Specs no configuration can run on this box, each refused for its own reason."""
    gpus = spec.resources.num_gpus
    if gpus != AUTO and int(gpus) > hw.gpu_count:
        raise PlanError(
            "resources.num_gpus",
            f"{gpus} GPUs asked, the box has {hw.gpu_count}",
            code="num_gpus_exceeds_box",
        )
    if spec.method.value == "qlora" and hw.qlora_unavailable is not None:
        raise PlanError(
            "method",
            f"QLoRA cannot run on this box: {hw.qlora_unavailable}; use method lora",
            code="method_unavailable",
        )


# --- the search space from the spec -------------------------------------------------------------------


def _device(value: object, pinned_device: object) -> tuple[OffloadDevice, ...] | None:
    if value != AUTO:
        return (OffloadDevice(str(value)),)
    if pinned_device in tuple(OffloadDevice):
        return (OffloadDevice(str(pinned_device)),)
    return None


def _stage(p: Prepared) -> tuple[int, ...] | None:
    value = p.spec.resources.zero_stage
    if value != AUTO:
        if p.pinned.stage is not None and p.pinned.stage != value:
            raise PlanError(
                "resources.deepspeed.stage",
                f"pins stage {p.pinned.stage} but resources.zero_stage is {value}",
            )
        return (int(value),)
    return (p.pinned.stage,) if p.pinned.stage is not None else None


def _check_explicit(
    p: Prepared,
    stages: tuple[int, ...] | None,
    opt: tuple[OffloadDevice, ...] | None,
    par: tuple[OffloadDevice, ...] | None,
    pinned: frozenset[str],
) -> None:
    if p.spec.method.value == "qlora" and stages and stages[0] == 3:
        raise PlanError("resources.zero_stage", "QLoRA runs under ZeRO stage 0, 1 or 2: the trainer loads "
                        "its 4-bit weights whole onto each GPU, which ZeRO-3 does not partition")
    if par and par[0] != "none" and stages and stages[0] != 3:
        raise PlanError("resources.offload_param", "parameter offload needs resources.zero_stage 3")
    if opt and opt[0] != "none" and stages and stages[0] == 0:
        raise PlanError("resources.offload_optimizer", "optimizer offload needs ZeRO stage 1, 2 or 3")
    if par == ("nvme",) and on_nvme(p.pinned.knobs, pinned) is None:
        raise PlanError(
            "resources.deepspeed.stage3_max_reuse_distance",
            "with the parameters on NVMe every parameter kept gathered for reuse holds a swap buffer: "
            "leave it out (the plan runs 0) or set offload_param.buffer_count for the parameters it keeps",
        )
    if opt and opt[0] != "none" and p.spec.training.optimizer.value == "adamw_8bit":
        raise PlanError(
            "training.optimizer",
            "adamw_8bit (bitsandbytes) runs on the GPU only; with optimizer "
            "offload use adamw (DeepSpeedCPUAdam)",
        )


def _choices(p: Prepared, base: Setup) -> tuple[Choices, bool]:
    t, r = p.spec.training, p.spec.resources
    gpus = None if r.num_gpus == AUTO else (int(r.num_gpus),)
    micro = None if t.micro_batch_size == AUTO else (int(t.micro_batch_size),)
    stages = _stage(p)
    opt = _device(r.offload_optimizer, p.pinned.offload_optimizer.get("device"))
    par = _device(r.offload_param, p.pinned.offload_param.get("device"))
    ckpt = None if t.gradient_checkpointing == AUTO else (bool(t.gradient_checkpointing),)
    chunk = None if t.loss_chunk_tokens == AUTO else (t.loss_chunk_tokens,)
    pinned = _pinned_knob_fields(p)
    _check_explicit(p, stages, opt, par, pinned)
    global_batch = t.gradient_accumulation_steps * (micro[0] if micro else 1) * (gpus[0] if gpus else 1)
    free = all_choices(base, p.bounds, global_batch)
    auto = None in (gpus, micro, stages, opt, par, ckpt, chunk)
    return Choices(
        num_gpus=gpus or free.num_gpus,
        micro_batch_size=micro,
        zero_stage=stages or free.zero_stage,
        offload_optimizer=opt or free.offload_optimizer,
        offload_param=par or free.offload_param,
        gradient_checkpointing=ckpt or free.gradient_checkpointing,
        loss_chunk_tokens=chunk or free.loss_chunk_tokens,
        global_batch=global_batch,
        explicit_accumulation=t.gradient_accumulation_steps if micro and gpus else None,
        knobs={s: knob_variants(p.facts, base.knobs, s, pinned) for s in stages or free.zero_stage},
        pinned=pinned,
    ), auto


def _pinned_knob_fields(p: Prepared) -> frozenset[str]:
    """The ZeroKnobs fields ``resources.deepspeed`` sets: the search leaves them as the user has them."""
    par = p.pinned.offload_param
    nested = {f"param_{k}" for k in ("buffer_size", "buffer_count") if k in par}
    return frozenset(INT_KNOB_FIELDS[k] for k in p.spec.resources.deepspeed if k in INT_KNOB_FIELDS) | nested


def _base_setup(p: Prepared) -> Setup:
    t = p.spec.training
    return Setup(
        method=p.spec.method,
        num_gpus=1,
        zero_stage=0,
        offload_optimizer=OffloadDevice.NONE,
        offload_param=OffloadDevice.NONE,
        micro_batch_size=1,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        seq_len=t.seq_len,
        gradient_checkpointing=False,
        precision=t.precision,
        optimizer=t.optimizer,
        attn_implementation=attention_for(p.arch, t.attn_implementation),
        knobs=p.pinned.knobs,
        loss_chunk_tokens=None if t.loss_chunk_tokens == AUTO else t.loss_chunk_tokens,
        attention_mask=not _rows_fill_seq_len(p.spec),
    )


def _rows_fill_seq_len(spec: JobSpec) -> bool:
    """Whether every training row is one sequence of ``seq_len`` tokens (each example truncated to
    it, as the dataset's counts show), so no row needs an attention mask: packing puts nothing
    beside it and padding has nothing to fill. Without the counts, rows are planned as masked."""
    ds = spec.dataset
    if ds is None or ds.num_rows is None or ds.num_tokens is None:
        return False
    return ds.num_tokens >= ds.num_rows * spec.training.seq_len


def attention_for(arch: Arch, requested: str | None) -> str:
    """The attention a job runs: the one it asks for, else what transformers picks. Recent
    transformers (5.24) refuses SDPA for Gemma 2, whose logit soft-capping needs eager attention,
    and picks eager; earlier ones (5.17) ran SDPA without the soft-capping, and a job that asks
    for SDPA gets it there."""
    if requested is not None:
        return requested
    return "eager" if arch.model_type == "gemma2" else "sdpa"


def _choose(p: Prepared, base: Setup) -> tuple[Candidate, Found, bool]:
    """The fastest configuration that fits, else the one closest to fitting (the spec as given)."""
    choices, auto = _choices(p, base)
    found = search(p.facts, base, choices, p.bounds, p.rates, done=distinct_changes(1 + _ALTERNATIVES))
    if found.points == 0:
        raise PlanError(
            "training.gradient_accumulation_steps",
            f"no way to split the global batch of {choices.global_batch} over the GPUs asked",
        )
    if found.best is not None:
        return found.best, found, auto
    usable = p.bounds.gpu_usable
    closest = min(found.evaluated, key=lambda c: (c.memory.required_bytes / usable, -c.speed.step_seconds))
    return closest, found, auto


def _free_choices(p: Prepared, facts: ModelFacts, base: Setup) -> Choices:
    """Every configuration of the box for ``base``'s job, its knobs free too."""
    free = all_choices(base, p.bounds, base.global_batch)
    variants = {stage: knob_variants(facts, base.knobs, stage, frozenset()) for stage in free.zero_stage}
    return replace(free, knobs=variants)


#: the job changes a refusal may propose, per method: cheaper methods the user may accept
_METHOD_FIXES = {"full": ("lora", "qlora"), "lora": ("qlora",), "qlora": ()}
_MIN_SEQ_LEN = 128


def _fixes(p: Prepared, asked: Candidate) -> list[Candidate]:
    """Configurations that fit, each a smallest change from ``asked`` for its speed, fastest
    first. The job itself changes only when no configuration of it fits: a cheaper method the
    user may accept, and for each method the longest sequence (halving seq_len) that fits."""
    current = asked.setup
    done = fixes_found(current, _ALTERNATIVES)
    found = search(p.facts, current, _free_choices(p, p.facts, current), p.bounds, p.rates, done=done)
    if found.fitting:
        return non_dominated(current, found.fitting, _ALTERNATIVES)
    fitting: list[Candidate] = []
    runnable = p.hardware.qlora_unavailable is None
    methods = [m for m in _METHOD_FIXES[current.method] if m != "qlora" or runnable]
    for method in (current.method, *methods):
        facts = p.facts if method == current.method else prepare_method(p, method)
        seq_len = current.seq_len if method != current.method else current.seq_len // 2
        while seq_len >= _MIN_SEQ_LEN:
            base = current.with_(method=method, seq_len=seq_len)
            shorter = search(facts, base, _free_choices(p, facts, base), p.bounds, p.rates, done=done)
            if shorter.fitting:
                fitting += shorter.fitting
                break
            seq_len //= 2
    fitting.sort(key=lambda c: (-c.speed.tokens_per_second, len(changes_between(current, c.setup))))
    return non_dominated(current, fitting, _ALTERNATIVES)


def prepare_method(p: Prepared, method: str) -> ModelFacts:
    lora = resolve_lora(p.arch, p.spec.lora.r, p.spec.lora.target_modules, p.spec.lora.dropout)
    return model_facts(p.arch, method, lora, p.spec.training.precision.value, p.facts.checkpoint_shard_bytes)


# --- output -------------------------------------------------------------------------------------------




def _kind(changes: Mapping[str, object]) -> str:
    if "method" in changes:
        return "method_change"
    return "shorter_seq_len" if "training.seq_len" in changes else "configuration"


def _job_change_text(changes: Mapping[str, object]) -> str:
    parts = []
    if "method" in changes:
        parts.append(f"changes the method to {changes['method']}")
    if "training.seq_len" in changes:
        parts.append(f"shortens the sequences to {changes['training.seq_len']} tokens")
    return " and ".join(parts) + ": " if parts else ""


def _alternative(p: Prepared, current: Candidate, c: Candidate, chosen_fits: bool) -> Alternative:
    changes: dict[str, Any] = dict(changes_between(current.setup, c.setup))
    kind = _kind(changes)
    tokens_per_second = c.speed.tokens_per_second * _row_fill(p.spec, c.setup.seq_len)
    ratio = tokens_per_second / (current.speed.tokens_per_second * _row_fill(p.spec, current.setup.seq_len))
    than = "the chosen configuration" if chosen_fits else "the configuration asked"
    what = _job_change_text(changes)
    reason = (
        f"{what}{c.memory.required_bytes / GIB:.1f} GiB per GPU of "
        f"{p.bounds.gpu_usable / GIB:.1f} GiB usable, "
        f"host {c.memory.host.total_bytes / GIB:.1f} GiB of {p.bounds.host_usable / GIB:.1f} GiB; "
        f"planned {tokens_per_second:,.0f} tokens/s, x{ratio:.2f} of {than}"
    )
    return Alternative(
        changes=changes,
        fits=c.fits,
        kind=kind,
        per_gpu_total_bytes=c.memory.total_bytes,
        per_gpu_required_bytes=c.memory.required_bytes,
        host_total_bytes=c.memory.host.total_bytes,
        estimated_step_seconds=round(c.speed.step_seconds, 6),
        estimated_tokens_per_second=round(tokens_per_second, 3),
        reason=reason,
    )


def _alternatives(p: Prepared, chosen: Candidate, found: Found) -> list[Alternative]:
    """Fitting plan: the next fastest configurations. Refusal: the smallest changes that fit."""
    ranked = non_dominated(chosen.setup, found.fitting, _ALTERNATIVES) if chosen.fits else _fixes(p, chosen)
    return [_alternative(p, chosen, c, chosen.fits) for c in ranked]


def _steps(spec: JobSpec, global_batch: int) -> int | None:
    if spec.training.max_steps is not None:
        return spec.training.max_steps
    ds, t, epochs = spec.dataset, spec.training, spec.training.epochs
    if ds is None or epochs is None:
        return None
    if t.packing and ds.num_packed_rows is not None:
        # the rows packing made, less the evaluation's share: a step takes micro_batch of them a GPU
        train_rows = ds.num_packed_rows * (1 - ds.eval_fraction)
        return max(1, math.ceil(math.ceil(train_rows) / global_batch * epochs))
    if t.packing and ds.num_tokens is not None:
        # at least this many rows of seq_len tokens (packing keeps whole examples, so rows are
        # rarely full: num_packed_rows says how many it made)
        train_tokens = ds.num_tokens * (1 - ds.eval_fraction)
        return max(1, math.ceil(math.ceil(train_tokens / t.seq_len) / global_batch * epochs))
    if ds.num_rows is None:
        return None
    train_rows = max(1, math.floor(ds.num_rows * (1 - ds.eval_fraction)))
    return max(1, math.ceil(train_rows / global_batch * epochs))


def _row_fill(spec: JobSpec, seq_len: int) -> float:
    """The share of a packed row's ``seq_len`` positions that hold an example's tokens, from the
    dataset's counts at the spec's own ``seq_len`` (packing keeps examples whole), else 1: tokens/s
    counts these tokens, as the trainer does."""
    ds, t = spec.dataset, spec.training
    if (not t.packing or ds is None or ds.num_tokens is None or ds.num_packed_rows is None
            or seq_len != t.seq_len):
        return 1.0
    return min(1.0, ds.num_tokens / (ds.num_packed_rows * t.seq_len))


def _disk(p: Prepared, s: Setup, steps: int | None, fits: bool, nvme_bytes: int
          ) -> tuple[DiskUsage, Note | None]:
    """The checkpoints' bytes, and NVMe offload's swap files where they share its disk, against the
    free disk of the job folder. A configuration that fits the GPUs but whose checkpoints the disk
    cannot hold is refused; where the GPUs already refuse it, the disk's shortfall is a warning
    beside that refusal and its alternatives."""
    t = p.spec.training
    w = 4 if s.precision == "fp32" else 2
    trainable = p.facts.trainable_parameters
    saved = p.arch.num_parameters if s.method == "full" else trainable
    one = int(trainable * (4 + moment_bytes_per_param(s.optimizer)) + 2 * saved * w)
    saves = math.ceil(steps / t.save_steps) if steps is not None else None
    limit = t.save_total_limit
    peak = (min(saves, limit + 1) if saves is not None else limit + 1) if limit is not None else saves
    swap = nvme_bytes if p.hardware.nvme_on_job_disk else 0
    total = one * (peak if peak is not None else 1) + swap
    free = p.hardware.disk_free_bytes
    usage = DiskUsage(checkpoint_bytes=one, checkpoints_at_peak=peak, nvme_swap_bytes=swap, total_bytes=total,
                      free_bytes=free, fits=free is None or total <= free)
    if usage.fits or free is None:
        return usage, None
    fix = ("a smaller training.save_total_limit, fewer saves (a larger training.save_steps) or free space"
           if (peak or 1) > 1 else "free space on the disk of the job folder")
    swapped = f" and {swap / GIB:.1f} GiB of NVMe swap files on the same disk" if swap else ""
    message = (f"the checkpoints need {(total - swap) / GIB:.1f} GiB on disk ({peak or 1} x "
               f"{one / GIB:.1f} GiB){swapped}, the disk of the job folder has {free / GIB:.1f} GiB free: "
               f"{fix}")
    if fits:
        raise PlanError("training.save_total_limit", message, code="insufficient_disk")
    return usage, Note(code="insufficient_disk", field="training.save_total_limit", message=message)


_M = TypeVar("_M", bound=BaseModel)


def _same_named(model: type[_M], *sources: object, **given: Any) -> _M:
    """``model`` from the attributes of ``sources`` that its fields name, and ``given``: the
    planner's estimates and its output name each figure once."""
    values = dict(given)
    for name, i in _field_sources(model, tuple(type(s) for s in sources), frozenset(given)):
        values[name] = getattr(sources[i], name)
    return model(**values)


@lru_cache(maxsize=64)
def _field_sources(model: type[BaseModel], types: tuple[type, ...], given: frozenset[str]
                   ) -> tuple[tuple[str, int], ...]:
    """Which of ``types`` (slotted dataclasses: their fields are class attributes) gives each field
    of ``model`` not in ``given``: the first that has it."""
    out = []
    for name in model.model_fields:
        if name not in given:
            i = next((i for i, t in enumerate(types) if hasattr(t, name)), None)
            if i is None:
                raise TypeError(f"nothing gives {model.__name__}.{name}")
            out.append((name, i))
    return tuple(out)


def _per_gpu(c: Candidate, capacity: int) -> PerGpuMemory:
    m = c.memory
    return _same_named(PerGpuMemory, m, m.activations, capacity_bytes=capacity,
                       allocator_limit_bytes=m.required_bytes - m.cuda_context_bytes)


def _host(c: Candidate, bounds: Bounds) -> HostMemory:
    h = c.memory.host
    fits = h.total_bytes <= bounds.host_usable
    return _same_named(HostMemory, h, capacity_bytes=bounds.host_bytes, fits=fits)


def _model_summary(p: Prepared) -> ModelSummary:
    a = p.arch
    # the summary spells the shape as a transformers config does
    return _same_named(ModelSummary, a, source=p.source,
                       trainable_parameters=p.facts.trainable_parameters, num_hidden_layers=a.num_layers,
                       num_attention_heads=a.num_heads, num_key_value_heads=a.num_kv_heads)


def _resolved(s: Setup) -> Resolved:
    return _same_named(Resolved, s, global_batch_size=s.global_batch)


def _eval(p: Prepared, e: EvalMemory, training_bytes: int) -> EvalEstimate:
    """The evaluation's figures; it fits beside training where the training's peak on its first
    GPU (where the evaluation runs) and the evaluation's own fit the GPU together."""
    ev = p.spec.eval
    return EvalEstimate(
        weights_bytes=e.weights_bytes,
        kv_cache_bytes=e.kv_cache_bytes,
        activations_bytes=e.activations_bytes,
        logits_bytes=e.logits_bytes,
        cuda_context_bytes=e.cuda_context_bytes,
        total_bytes=e.total_bytes,
        capacity_bytes=p.bounds.gpu_bytes,
        fits=e.total_bytes <= p.bounds.gpu_usable,
        fits_beside_training=e.total_bytes + training_bytes <= p.bounds.gpu_usable,
        batch_size=ev.batch_size,
        prompt_tokens=e.prompt_tokens,
        max_new_tokens=ev.max_new_tokens,
    )


def _nothing_fits(p: Prepared, closest: Candidate) -> Note:
    methods = ", ".join((closest.setup.method, *_METHOD_FIXES[closest.setup.method]))
    return Note(
        code="nothing_fits",
        field="model",
        message=(
            f"no configuration of this box fits ({p.bounds.gpu_count} x {p.bounds.gpu_usable / GIB:.1f} GiB "
            f"usable GPU memory, {p.bounds.host_usable / GIB:.1f} GiB usable host RAM, "
            f"{p.bounds.nvme_bytes / GIB:.0f} GiB NVMe), with any ZeRO stage, offload, checkpointing or "
            f"micro-batch, as {methods}, or with seq_len down to {_MIN_SEQ_LEN}; the closest needs "
            f"{closest.memory.required_bytes / GIB:.1f} GiB per GPU and "
            f"{closest.memory.host.total_bytes / GIB:.1f} GiB of host RAM: a smaller model or a larger box"
        ),
    )


def plan(spec: JobSpec | Mapping[str, Any], *, hardware: HardwareSpec | None = None) -> Plan:
    """Plan a job: does it fit, how fast, with which DeepSpeed config; "auto" filled."""
    p = prepare(spec, hardware)
    chosen, found, auto = _choose(p, _base_setup(p))
    s = chosen.setup
    e = estimate_eval(p.facts, s.precision, s.seq_len, p.spec.eval.max_new_tokens, p.spec.eval.batch_size)
    ev = p.spec.eval
    ctx = Context(
        facts=p.facts,
        chosen=chosen,
        bounds=p.bounds,
        eval_memory=e,
        eval_enabled=ev.when.value != "none",
        config_dtype_field=p.config_dtype_field,
        evaluate=lambda changed: evaluate(p.facts, changed, p.bounds, p.rates),
        eval_at=lambda rows: estimate_eval(p.facts, s.precision, s.seq_len, ev.max_new_tokens, rows),
        eval_batch_size=ev.batch_size,
        micro_batch_pinned=p.spec.training.micro_batch_size != AUTO,
    )
    warnings: list[Note] = warn(ctx)
    if (why := p.hardware.nvme_unavailable) and not chosen.fits:
        warnings.append(
            Note(
                code="nvme_unavailable",
                field="resources.offload_optimizer",
                message=f"NVMe offload was not considered; it cannot run on this box: {why}",
            )
        )
    card = p.figures.card
    if card is not None and card.bf16_tflops is None and s.precision == "bf16":
        warnings.append(
            Note(
                code="no_bf16",
                field="training.precision",
                message=f"{card.name} ({card.architecture}) has no bf16 tensor cores: use fp16",
            )
        )
    alternatives = _alternatives(p, chosen, found)
    if not chosen.fits and not alternatives:
        warnings.append(_nothing_fits(p, chosen))
    steps = _steps(p.spec, s.global_batch)
    disk, disk_note = _disk(p, s, steps, chosen.fits, chosen.memory.nvme_bytes)
    if disk_note is not None:
        warnings.append(disk_note)
    ds = build_deepspeed_config(
        s,
        p.pinned,
        learning_rate=p.spec.training.learning_rate,
        weight_decay=p.spec.training.weight_decay,
        nvme_path=p.hardware.nvme_path,
    )
    return Plan(
        fits=chosen.fits,
        margin_bytes=p.bounds.gpu_usable - chosen.memory.required_bytes,
        num_gpus=s.num_gpus,
        resolved=_resolved(s),
        model=_model_summary(p),
        per_gpu=_per_gpu(chosen, p.bounds.gpu_bytes),
        host=_host(chosen, p.bounds),
        nvme=NvmeUsage(
            total_bytes=chosen.memory.nvme_bytes,
            capacity_bytes=p.bounds.nvme_bytes,
            fits=chosen.memory.nvme_bytes <= p.bounds.nvme_bytes,
        ),
        disk=disk,
        eval=_eval(p, e, chosen.memory.total_bytes),
        estimated_step_seconds=round(chosen.speed.step_seconds, 6),
        estimated_tokens_per_second=round(chosen.speed.tokens_per_second * _row_fill(p.spec, s.seq_len), 3),
        step_time_factor=p.rates.step_time_factor,
        host_clock_factor=p.rates.host_clock_factor,
        estimated_steps=steps,
        estimated_duration_seconds=round(steps * chosen.speed.step_seconds, 3) if steps is not None else None,
        deepspeed_config=ds,
        hardware=planned_hardware(p.figures),
        alternatives=alternatives,
        warnings=warnings,
        advice=advise(ctx, chosen.fits),
    )
