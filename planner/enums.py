"""The choices a job spec names and a resolved configuration (``planner.setup.Setup``) holds: one
definition for both. Members are strings, so ``Method.FULL == "full"``."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Method", "OffloadDevice", "Optimizer", "Precision"]


class Method(StrEnum):
    LORA = "lora"
    QLORA = "qlora"
    FULL = "full"


class Precision(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw_8bit"
    LION = "lion"
    SGD = "sgd"


class OffloadDevice(StrEnum):
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"
