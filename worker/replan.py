"""A job that ran out of its planned GPU memory, planned again with the peak it reached.

Every training process is held to its plan (``launcher.gpu_memory_limit``). Where the plan was
short and the job's card holds more, ending the job ``failed`` would punish the user for the
estimator's error: instead the job is planned again once, with PyTorch's bound raised to what the
process had reserved plus the request that failed, and queued again. The error band
(``gpu_memory_tolerance``) comes on top of that bound as it does on every plan. A job that runs out
again, or whose new bound its card cannot hold, fails ``cuda_oom`` with the figures.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from planner.constants import GIB


@dataclass(frozen=True)
class Replanned:
    """The plan to queue the job with, and what to tell the user."""

    plan: dict[str, Any]
    #: what each of the job's leases must hold more than before
    added_bytes: int
    message: str
    data: dict[str, Any]


def needed_bytes(figures: dict[str, Any]) -> int | None:
    """What PyTorch needed on the GPU when it ran out: its reserved peak plus the failed request."""
    reserved = figures.get("max_reserved_bytes")
    requested = figures.get("requested_bytes")
    if not isinstance(reserved, int) or not isinstance(requested, int) or reserved <= 0:
        return None
    return reserved + max(0, requested)


def replan_after_oom(plan: dict[str, Any], figures: dict[str, Any], card_bytes: int,
                     tolerance: float) -> Replanned | str:
    """The plan with PyTorch's bound raised to the need ``figures`` show, or why there is none.

    ``figures`` is what the training wrote at its out-of-memory error (``failure.json``'s
    ``data``): the allocator limit it ran under, its reserved peak and the request that failed.
    ``card_bytes`` is the smallest of the job's cards as the inventory has it (the box's per-card
    limit applied)."""
    if plan.get("replanned_after_oom"):
        return "it was already planned again once after running out of GPU memory"
    limit = figures.get("gpu_memory_limit_bytes")
    need = needed_bytes(figures)
    per_gpu = plan.get("per_gpu") or {}
    total = per_gpu.get("total_bytes")
    if not isinstance(limit, int) or need is None or not total:
        return "the training reported no allocator limit or peak to plan with"
    outside = int(per_gpu.get("cuda_context_bytes") or 0)
    bound = max(need, int(per_gpu.get("allocator_limit_bytes") or 0))
    required = bound + outside
    held = required + int(tolerance * required)
    if held > card_bytes:
        return (f"it needed {need / GIB:.2f} GiB in PyTorch's allocator ({held / GIB:.2f} GiB on the "
                "card with the memory outside PyTorch and the error band); the card holds "
                f"{card_bytes / GIB:.2f} GiB")
    new = copy.deepcopy(plan)
    record = {"previous_required_bytes": int(per_gpu.get("required_bytes") or total),
              "previous_limit_bytes": limit, "needed_bytes": need, "allocator_limit_bytes": bound,
              "required_bytes": required}
    new["per_gpu"] = {**per_gpu, "allocator_limit_bytes": bound, "required_bytes": required,
                      "total_bytes": max(int(total), required)}
    new["replanned_after_oom"] = record
    message = (f"ran out of GPU memory under its plan ({limit / GIB:.2f} GiB for PyTorch): it needed "
               f"{need / GIB:.2f} GiB; planned again at {required / GIB:.2f} GiB per GPU and queued again")
    return Replanned(plan=new, added_bytes=required - record["previous_required_bytes"], message=message,
                     data=record)
