"""Filling "auto": the fastest configuration that fits, and ranked alternatives.

The seed's ladder orders the search: configurations without offload first (checkpointing,
smaller micro-batches with more accumulation, higher ZeRO stages, more GPUs), CPU offload only
when none of those fits, NVMe last. Within a tier the fastest wins. The global batch
(micro x accumulation x GPUs) stays what the user asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from planner import constants as C
from planner.memory import MemoryEstimate, ModelFacts, estimate_memory
from planner.setup import Device, Setup
from planner.speed import GpuRates, SpeedEstimate, estimate_speed

__all__ = ["Bounds", "Candidate", "Choices", "cheapest_fixes", "enumerate_candidates", "evaluate", "rank_key"]

_DEVICES: tuple[Device, ...] = ("none", "cpu", "nvme")


@dataclass(frozen=True, slots=True)
class Bounds:
    """What the box holds: capacities and the margins a fit must leave."""

    gpu_count: int
    gpu_bytes: int
    host_bytes: int
    nvme_bytes: int

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
        devices = (self.setup.offload_optimizer, self.setup.offload_param)
        return 2 if "nvme" in devices else 1 if "cpu" in devices else 0


@dataclass(frozen=True, slots=True)
class Choices:
    """Allowed values per dimension; one value where the spec pins it."""

    num_gpus: Sequence[int]
    micro_batch_size: Sequence[int] | None  # None: any divisor of the per-GPU batch
    zero_stage: Sequence[int]
    offload_optimizer: Sequence[Device]
    offload_param: Sequence[Device]
    gradient_checkpointing: Sequence[bool]
    global_batch: int
    explicit_accumulation: int | None  # with micro-batch and GPUs pinned, accumulation is the user's


def fits_bounds(memory: MemoryEstimate, s: Setup, bounds: Bounds) -> bool:
    return (
        s.num_gpus <= bounds.gpu_count
        and memory.required_bytes <= bounds.gpu_usable
        and memory.host.total_bytes <= bounds.host_usable
        and memory.nvme_bytes <= bounds.nvme_bytes
    )


def evaluate(facts: ModelFacts, s: Setup, bounds: Bounds, rates: GpuRates) -> Candidate:
    memory = estimate_memory(facts, s)
    return Candidate(s, memory, estimate_speed(facts, s, rates), fits_bounds(memory, s, bounds))


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


def _valid(stage: int, opt: Device, par: Device, base: Setup) -> bool:
    if opt != "none" and stage == 0:
        return False  # DeepSpeed offloads the optimizer only through ZeRO 1-3
    if par != "none" and stage != 3:
        return False
    return not (opt != "none" and base.optimizer == "adamw_8bit")


def _tier(opt: Device, par: Device) -> int:
    return 2 if "nvme" in (opt, par) else 1 if "cpu" in (opt, par) else 0


def enumerate_candidates(
    facts: ModelFacts,
    base: Setup,
    ch: Choices,
    bounds: Bounds,
    rates: GpuRates,
    tiers: tuple[int, ...] = (0, 1, 2),
) -> list[Candidate]:
    """Evaluate every allowed combination whose offload tier is in ``tiers``."""
    devices = [
        (stage, opt, par)
        for stage in ch.zero_stage
        for opt in ch.offload_optimizer
        for par in ch.offload_param
        if _valid(stage, opt, par, base) and _tier(opt, par) in tiers
    ]
    out: list[Candidate] = []
    for gpus, micro, accum in _batch_splits(ch):
        for stage, opt, par in devices:
            for ckpt in ch.gradient_checkpointing:
                s = Setup(
                    base.method,
                    gpus,
                    stage,
                    opt,
                    par,
                    micro,
                    accum,
                    base.seq_len,
                    ckpt,
                    base.precision,
                    base.optimizer,
                    base.attn_implementation,
                    base.knobs,
                )
                out.append(evaluate(facts, s, bounds, rates))
    return out


def rank_key(c: Candidate) -> tuple[int, float, int, int]:
    return (c.tier, c.speed.step_seconds, c.setup.num_gpus, c.memory.total_bytes)


def all_choices(base: Setup, bounds: Bounds, global_batch: int) -> Choices:
    devices: tuple[Device, ...] = _DEVICES if bounds.nvme_bytes > 0 else ("none", "cpu")
    return Choices(
        num_gpus=range(1, bounds.gpu_count + 1),
        micro_batch_size=None,
        zero_stage=(0, 1, 2, 3),
        offload_optimizer=devices,
        offload_param=devices,
        gradient_checkpointing=(False, True),
        global_batch=global_batch,
        explicit_accumulation=None,
    )


# Cost of each lever, following the ladder: cheap memory savers first, offload late, NVMe last,
# changing the job itself (method, sequence length) only when nothing else helps.
_LEVER_COST = {
    "training.gradient_checkpointing": 1,
    "training.micro_batch_size": 1,
    "training.gradient_accumulation_steps": 0,
    "resources.zero_stage": 2,
    "resources.num_gpus": 3,
    "resources.offload_optimizer": 5,
    "resources.offload_param": 6,
}


def changes_between(a: Setup, b: Setup) -> dict[str, object]:
    """Spec paths whose values differ from ``a`` to ``b``."""
    fields = {
        "training.gradient_checkpointing": "gradient_checkpointing",
        "training.micro_batch_size": "micro_batch_size",
        "training.gradient_accumulation_steps": "gradient_accumulation_steps",
        "resources.zero_stage": "zero_stage",
        "resources.num_gpus": "num_gpus",
        "resources.offload_optimizer": "offload_optimizer",
        "resources.offload_param": "offload_param",
        "method": "method",
        "training.seq_len": "seq_len",
    }
    return {path: getattr(b, attr) for path, attr in fields.items() if getattr(a, attr) != getattr(b, attr)}


def change_cost(changes: dict[str, object]) -> int:
    cost = 0
    for path, value in changes.items():
        cost += _LEVER_COST.get(path, 20)
        if value == "nvme":
            cost += 4
    return cost


def cheapest_fixes(current: Setup, candidates: Sequence[Candidate], limit: int) -> list[Candidate]:
    """Fitting candidates ordered by how small a change they are from ``current``."""
    fitting = [c for c in candidates if c.fits and c.setup != current]
    fitting.sort(key=lambda c: (change_cost(changes_between(current, c.setup)), c.tier, c.speed.step_seconds))
    return _distinct(current, fitting, limit)


def _distinct(current: Setup, ordered: Sequence[Candidate], limit: int) -> list[Candidate]:
    seen: set[frozenset[str]] = set()
    out: list[Candidate] = []
    for c in ordered:
        key = frozenset(changes_between(current, c.setup))
        if key in seen:
            continue
        seen.add(key)
        out.append(c)
        if len(out) == limit:
            break
    return out


def ranked_alternatives(chosen: Candidate, candidates: Sequence[Candidate], limit: int) -> list[Candidate]:
    fitting = sorted((c for c in candidates if c.fits and c.setup != chosen.setup), key=rank_key)
    return _distinct(chosen.setup, fitting, limit)
