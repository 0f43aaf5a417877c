"""The learning-rate schedule as a factor of the peak LR, per optimizer step."""

from __future__ import annotations

import math
from collections.abc import Callable


def warmup_steps(total: int, ratio: float) -> int:
    return math.ceil(total * ratio) if ratio > 0 else 0


def lr_factor(kind: str, total: int, warmup: int) -> Callable[[int], float]:
    """``f(step)`` for step 0..total-1: linear warmup (never 0), then cosine, linear or constant."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return 1.0

    return factor
