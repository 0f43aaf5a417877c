"""Counts from a real torch model, for checking the planner's arithmetic against a live module.

Imported only by whoever holds a model (tests, the trainer); ``planner`` itself never imports it,
so the API process never loads torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ParameterCount", "count_parameters"]


@dataclass(frozen=True, slots=True)
class ParameterCount:
    total: int  # distinct parameters (tied weights once)
    trainable: int
    largest_tensor: int  # elements of the largest parameter


def count_parameters(model: Any) -> ParameterCount:
    """Count ``model.parameters()`` once per distinct tensor.

    Distinct by identity, not by ``data_ptr()``: on the meta device every pointer is 0, which is why
    DeepSpeed's ``*_all_live`` estimators miscount meta models.
    """
    seen: dict[int, Any] = {}
    for param in model.parameters():
        seen.setdefault(id(param), param)
    total = sum(int(p.numel()) for p in seen.values())
    trainable = sum(int(p.numel()) for p in seen.values() if p.requires_grad)
    largest = max((int(p.numel()) for p in seen.values()), default=0)
    return ParameterCount(total=total, trainable=trainable, largest_tensor=largest)
