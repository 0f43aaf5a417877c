"""Filling "auto": the fastest configuration that fits, and the fixes for one that does not.

Every allowed combination of GPU count, ZeRO stage, offload devices, checkpointing, micro-batch
(accumulation keeping the global batch) and ZeRO knob set is a point of the search; the chosen
one is the fitting point of the highest planned tokens/s. The space does not depend on the box's
capacities, only which of its points fit does, so more GPU memory, more GPUs or more host RAM
never gives a slower choice. The field report's ladder (checkpointing and accumulation before
offload, NVMe last) breaks ties and shapes the advice; it never hides a faster fitting point.

Points are scored on the step-time model first (cheap) and their memory is estimated in order of
speed, until the first that fits and enough distinct alternatives are found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from planner import constants as C
from planner.memory import MemoryEstimate, ModelFacts, estimate_memory
from planner.setup import OffloadDevice, Setup, ZeroKnobs
from planner.speed import GpuRates, SpeedEstimate, estimate_speed

__all__ = [
    "Bounds",
    "Candidate",
    "Choices",
    "Found",
    "all_choices",
    "changes_between",
    "evaluate",
    "fits_bounds",
    "knob_variants",
    "on_nvme",
    "search",
]

_DEVICES: tuple[OffloadDevice, ...] = tuple(OffloadDevice)

#: ZeRO-3 knobs that trade memory for collectives the step-time model does not charge: the lean set
#: is tried only after the default at the same point, so it is chosen only where it makes a point fit.
LEAN_STAGE3: dict[str, int] = {
    "prefetch_bucket_size": 50_000_000,
    "max_live_parameters": 100_000_000,
    "max_reuse_distance": 100_000_000,
    "sub_group_size": 100_000_000,
}
#: the smallest reduce bucket the search sizes for adapters (DeepSpeed's buckets are elements)
MIN_REDUCE_BUCKET = 1_000_000
#: the chunk the search tries for the loss (positions whose logits exist at once): a micro-batch of
#: more positions may compute its loss in chunks of this many instead of over its full logits
LOSS_CHUNK_TOKENS = 1024

#: ZeroKnobs field -> the spec path a change to it is reported under
KNOB_PATHS: dict[str, str] = {
    "reduce_bucket_size": "resources.deepspeed.reduce_bucket_size",
    "prefetch_bucket_size": "resources.deepspeed.stage3_prefetch_bucket_size",
    "max_live_parameters": "resources.deepspeed.stage3_max_live_parameters",
    "max_reuse_distance": "resources.deepspeed.stage3_max_reuse_distance",
    "sub_group_size": "resources.deepspeed.sub_group_size",
}

_SETUP_PATHS: dict[str, str] = {
    "method": "method",
    "training.seq_len": "seq_len",
    "resources.num_gpus": "num_gpus",
    "resources.zero_stage": "zero_stage",
    "resources.offload_optimizer": "offload_optimizer",
    "resources.offload_param": "offload_param",
    "training.gradient_checkpointing": "gradient_checkpointing",
    "training.micro_batch_size": "micro_batch_size",
    "training.gradient_accumulation_steps": "gradient_accumulation_steps",
    "training.loss_chunk_tokens": "loss_chunk_tokens",
}


@dataclass(frozen=True, slots=True)
class Bounds:
    """What the box holds: capacities and the margins a fit must leave."""

    gpu_count: int
    gpu_bytes: int
    host_bytes: int
    nvme_bytes: int
    #: the box's learned scale of the allocator's slack and the CUDA context (1: none learned)
    memory_correction: float = 1.0

    @property
    def gpu_usable(self) -> int:
        return int(self.gpu_bytes * (1 - C.GPU_SAFETY_FRACTION))

    @property
    def host_usable(self) -> int:
        return int(self.host_bytes * (1 - C.HOST_SAFETY_FRACTION))


@dataclass(frozen=True, slots=True)
class Candidate:
    setup: Setup
    memory: MemoryEstimate
    speed: SpeedEstimate
    fits: bool

    @property
    def tier(self) -> int:
        return _tier(self.setup.offload_optimizer, self.setup.offload_param)


@dataclass(frozen=True, slots=True)
class Choices:
    """Allowed values per dimension; one value where the spec pins it."""

    num_gpus: Sequence[int]
    micro_batch_size: Sequence[int] | None  # None: any divisor of the per-GPU batch
    zero_stage: Sequence[int]
    offload_optimizer: Sequence[OffloadDevice]
    offload_param: Sequence[OffloadDevice]
    gradient_checkpointing: Sequence[bool]
    global_batch: int
    explicit_accumulation: int | None  # with micro-batch and GPUs pinned, accumulation is the user's
    #: knob sets per ZeRO stage, preferred first; a stage not listed runs the base setup's knobs
    knobs: dict[int, tuple[ZeroKnobs, ...]] = field(default_factory=dict)
    #: the loss's chunk (None: the full logits); a chunk the search offers is tried only where a
    #: micro-batch holds more positions
    loss_chunk_tokens: Sequence[int | None] = (None,)
    #: the ZeroKnobs fields the spec sets (``on_nvme`` leaves them as they are)
    pinned: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Found:
    """A search's result: the fitting points it met, fastest first, and every point it estimated."""

    fitting: list[Candidate]
    evaluated: list[Candidate]
    points: int  # points of the space (scored on speed)

    @property
    def best(self) -> Candidate | None:
        return self.fitting[0] if self.fitting else None


def fits_bounds(memory: MemoryEstimate, s: Setup, bounds: Bounds) -> bool:
    return (
        s.num_gpus <= bounds.gpu_count
        and memory.required_bytes <= bounds.gpu_usable
        and memory.host.total_bytes <= bounds.host_usable
        and memory.nvme_bytes <= bounds.nvme_bytes
    )


def evaluate(facts: ModelFacts, s: Setup, bounds: Bounds, rates: GpuRates) -> Candidate:
    memory = estimate_memory(facts, s, bounds.memory_correction)
    return Candidate(s, memory, estimate_speed(facts, s, rates), fits_bounds(memory, s, bounds))


def knob_variants(
    facts: ModelFacts, knobs: ZeroKnobs, stage: int, pinned: frozenset[str]
) -> tuple[ZeroKnobs, ...]:
    """The knob sets the search tries at one ZeRO stage, the preferred first; ``pinned`` names the
    ZeroKnobs fields the user set, which stay as they are.

    Adapters train few parameters: a reduce bucket larger than all of them allocates memory that
    no gradient uses and reduces nothing more per collective, so it is sized down to them.

    Parameters on NVMe are read whole into one of ``param_buffer_count`` buffers of
    ``param_buffer_size`` elements each, sized to the largest parameter. Under activation
    checkpointing a layer's recompute in backward holds every frozen parameter it fetches until the
    backward of the module that started it ends, so the buffers hold one decoder layer's swapped
    tensors and one more (the jobs that failed with fewer, or smaller, buffers:
    ``bench/results/nvme-offload``). That holds only where each parameter gives its buffer back once
    its module has run: ``on_nvme``.
    """
    if stage == 0:
        return (knobs,)
    t = facts.trainable_parameters
    if facts.lora is not None and "reduce_bucket_size" not in pinned:
        knobs = replace(knobs, reduce_bucket_size=min(knobs.reduce_bucket_size, max(t, MIN_REDUCE_BUCKET)))
    if stage != 3:
        return (knobs,)
    if "param_buffer_size" not in pinned:
        knobs = replace(knobs, param_buffer_size=facts.arch.largest_param)
    if "param_buffer_count" not in pinned:
        swapped = sum(n > knobs.param_persistence_threshold for n in facts.arch.layer_tensor_sizes)
        knobs = replace(knobs, param_buffer_count=max(knobs.param_buffer_count, swapped + 1))
    lean_changes = {k: v for k, v in LEAN_STAGE3.items() if k not in pinned and getattr(knobs, k) > v}
    if not lean_changes:
        return (knobs,)
    return knobs, replace(knobs, **lean_changes)  # type: ignore[arg-type]


def on_nvme(knobs: ZeroKnobs, pinned: frozenset[str]) -> ZeroKnobs | None:
    """The knobs of a point whose parameters live on NVMe, where each gathered parameter holds a swap
    buffer of its own. DeepSpeed's NVMe prefetch takes every free buffer for the parameters its
    trace expects next, and once the trace is complete (from the second step on) the coordinator
    keeps gathered every parameter used again within ``stage3_max_reuse_distance`` elements: a
    fetch of any other parameter then finds no buffer (``Not enough buffers 0 for swapping 1``;
    ``bench/results/nvme-offload``). Without a prefetch bucket and with a reuse distance of 0,
    ``knob_variants``' buffers hold. A knob the spec sets stays as it is; a reuse distance it sets
    with buffers it leaves to the planner has no NVMe point (None)."""
    if "max_reuse_distance" in pinned and knobs.max_reuse_distance > 0 and "param_buffer_count" not in pinned:
        return None
    changes = {k: 0 for k in ("prefetch_bucket_size", "max_reuse_distance") if k not in pinned}
    return replace(knobs, **changes)  # type: ignore[arg-type]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _batch_splits(ch: Choices) -> Iterator[tuple[int, int, int]]:
    for gpus in ch.num_gpus:
        if ch.explicit_accumulation is not None and ch.micro_batch_size is not None:
            for micro in ch.micro_batch_size:
                yield gpus, micro, ch.explicit_accumulation
            continue
        if ch.global_batch % gpus:
            continue
        per_gpu = ch.global_batch // gpus
        micros = ch.micro_batch_size if ch.micro_batch_size is not None else _divisors(per_gpu)
        for micro in micros:
            if per_gpu % micro == 0:
                yield gpus, micro, per_gpu // micro


def _valid(stage: int, opt: OffloadDevice, par: OffloadDevice, base: Setup) -> bool:
    if opt != "none" and stage == 0:
        return False  # DeepSpeed offloads the optimizer only through ZeRO 1-3
    if par != "none" and stage != 3:
        return False
    if base.method == "qlora" and stage == 3:
        return False  # the trainer loads the 4-bit weights whole onto each GPU (a device_map)
    return not (opt != "none" and base.optimizer == "adamw_8bit")


def _tier(opt: OffloadDevice, par: OffloadDevice) -> int:
    return 2 if "nvme" in (opt, par) else 1 if "cpu" in (opt, par) else 0


def points(base: Setup, ch: Choices) -> Iterator[tuple[Setup, int]]:
    """Every allowed setup with the rank of its knob set (0: the preferred)."""
    devices = [
        (stage, opt, par)
        for stage in ch.zero_stage
        for opt in ch.offload_optimizer
        for par in ch.offload_param
        if _valid(stage, opt, par, base)
    ]
    b = base
    # each stage's knob sets with their rank, and as the parameters on NVMe have them
    variants = {stage: [(rank, v, on_nvme(v, ch.pinned))
                        for rank, v in enumerate(ch.knobs.get(stage, (b.knobs,)))]
                for stage in ch.zero_stage}
    offered = len(ch.loss_chunk_tokens) > 1
    for gpus, micro, accum in _batch_splits(ch):
        chunks = [c for c in ch.loss_chunk_tokens
                  if not (offered and c is not None and c >= micro * b.seq_len)]
        for stage, opt, par in devices:
            for ckpt in ch.gradient_checkpointing:
                for chunk in chunks:
                    for rank, variant, nvme_variant in variants[stage]:
                        knobs = nvme_variant if par == "nvme" else variant
                        if knobs is None:
                            continue
                        yield Setup(
                            b.method, gpus, stage, opt, par, micro, accum, b.seq_len, ckpt, b.precision,
                            b.optimizer, b.attn_implementation, knobs, chunk, b.attention_mask,
                        ), rank


def _order(item: tuple[Setup, int, SpeedEstimate]) -> tuple[float, int, int, int, bool, int]:
    """Fastest first; at equal planned speed the ladder's order: no offload, fewer GPUs, the
    preferred knobs, no checkpointing, the larger micro-batch."""
    s, rank, speed = item
    return (
        -speed.tokens_per_second,
        _tier(s.offload_optimizer, s.offload_param),
        s.num_gpus,
        rank,
        s.gradient_checkpointing,
        -s.micro_batch_size,
    )


def search(
    facts: ModelFacts,
    base: Setup,
    ch: Choices,
    bounds: Bounds,
    rates: GpuRates,
    *,
    done: Callable[[Sequence[Candidate]], bool] = bool,
) -> Found:
    """Estimate memory in order of planned speed until ``done(fitting points so far)``; by
    default, the first fitting point."""
    scored = [(s, rank, estimate_speed(facts, s, rates)) for s, rank in points(base, ch)]
    scored.sort(key=_order)
    fitting: list[Candidate] = []
    evaluated: list[Candidate] = []
    too_big: set[tuple[object, ...]] = set()
    usable = bounds.gpu_usable
    for s, _, speed in scored:
        group = _states_key(s)
        if group in too_big:
            continue
        memory = estimate_memory(facts, s, bounds.memory_correction)
        if memory.weights_bytes + memory.optimizer_states_bytes > usable:
            too_big.add(group)
        c = Candidate(s, memory, speed, fits_bounds(memory, s, bounds))
        evaluated.append(c)
        if c.fits:
            fitting.append(c)
            if done(fitting):
                break
    return Found(fitting, evaluated, len(scored))


def _states_key(s: Setup) -> tuple[object, ...]:
    """What a GPU's weights and optimizer states depend on: all of the setup but the batch split
    and checkpointing. Their sum never exceeds what must fit, so where it alone is more than the
    GPU, no micro-batch and no checkpointing of the same states fits (tests/planner check both)."""
    return (s.method, s.num_gpus, s.zero_stage, s.offload_optimizer, s.offload_param, s.seq_len,
            s.precision, s.optimizer, s.knobs)


def distinct_changes(limit: int) -> Callable[[Sequence[Candidate]], bool]:
    """A ``done`` for ``search``: ``limit`` fitting points with distinct changes from the first."""

    def done(fitting: Sequence[Candidate]) -> bool:
        ref = fitting[0].setup
        return len({frozenset(changes_between(ref, c.setup)) for c in fitting}) >= limit

    return done


def fixes_found(current: Setup, limit: int) -> Callable[[Sequence[Candidate]], bool]:
    """A ``done`` for ``search``: ``limit`` smallest changes from ``current`` (``non_dominated``)."""

    def done(fitting: Sequence[Candidate]) -> bool:
        return len(non_dominated(current, fitting, limit)) >= limit

    return done


def all_choices(base: Setup, bounds: Bounds, global_batch: int) -> Choices:
    devices = _DEVICES if bounds.nvme_bytes > 0 else (OffloadDevice.NONE, OffloadDevice.CPU)
    return Choices(
        num_gpus=range(1, bounds.gpu_count + 1),
        micro_batch_size=None,
        zero_stage=(0, 1, 2, 3),
        offload_optimizer=devices,
        offload_param=devices,
        gradient_checkpointing=(False, True),
        global_batch=global_batch,
        explicit_accumulation=None,
        loss_chunk_tokens=(None, LOSS_CHUNK_TOKENS),
    )


def changes_between(a: Setup, b: Setup) -> dict[str, object]:
    """Spec paths whose values differ from ``a`` to ``b``, ZeRO knobs included."""
    out: dict[str, object] = {
        path: getattr(b, attr) for path, attr in _SETUP_PATHS.items() if getattr(a, attr) != getattr(b, attr)
    }
    if b.zero_stage > 0:
        for knob, path in KNOB_PATHS.items():
            if getattr(a.knobs, knob) != getattr(b.knobs, knob):
                out[path] = getattr(b.knobs, knob)
    return out


def non_dominated(current: Setup, fastest_first: Sequence[Candidate], limit: int) -> list[Candidate]:
    """Fitting candidates, fastest first, leaving out any whose changes from ``current`` include
    all the changes of a faster (or equally fast) one already listed: each entry is a smallest
    change for its speed."""
    kept: list[tuple[frozenset[str], Candidate]] = []
    for c in fastest_first:
        if not c.fits or c.setup == current:
            continue
        keys = frozenset(changes_between(current, c.setup))
        if any(k <= keys for k, _ in kept):
            continue
        kept.append((keys, c))
        if len(kept) == limit:
            break
    return [c for _, c in kept]


def ranked_alternatives(chosen: Candidate, fastest_first: Sequence[Candidate], limit: int) -> list[Candidate]:
    """The next fitting configurations after ``chosen``, fastest first, one per set of changes."""
    seen: set[frozenset[str]] = set()
    out: list[Candidate] = []
    for c in fastest_first:
        if not c.fits or c.setup == chosen.setup:
            continue
        keys = frozenset(changes_between(chosen.setup, c.setup))
        if keys in seen:
            continue
        seen.add(keys)
        out.append(c)
        if len(out) == limit:
            break
    return out
