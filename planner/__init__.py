"""tunebox's planner: will a fine-tuning job fit, how fast will it run, with which DeepSpeed config.

Pure and typed: no torch, no I/O at import (a ``model.path`` is read when planned). The torch
adapter lives in ``planner.torch_adapter`` and is imported only by whoever needs it.
"""

from __future__ import annotations

from planner.arch import Arch, arch_from_config
from planner.core import plan, prepare
from planner.dsconfig import build_deepspeed_config, parse_pinned, to_hf_trainer_config
from planner.errors import PlanError
from planner.facts import model_facts
from planner.lora import resolve_lora
from planner.memory import MemoryEstimate, ModelFacts, estimate_memory
from planner.models import Alternative, Note, Plan
from planner.setup import Setup, ZeroKnobs
from planner.spec import HardwareSpec, JobSpec
from planner.speed import GpuRates, SpeedEstimate, estimate_speed, host_clock_factor

__all__ = [
    "Alternative",
    "Arch",
    "GpuRates",
    "HardwareSpec",
    "JobSpec",
    "MemoryEstimate",
    "ModelFacts",
    "Note",
    "Plan",
    "PlanError",
    "Setup",
    "SpeedEstimate",
    "ZeroKnobs",
    "arch_from_config",
    "build_deepspeed_config",
    "estimate_memory",
    "estimate_speed",
    "host_clock_factor",
    "model_facts",
    "parse_pinned",
    "plan",
    "prepare",
    "resolve_lora",
    "to_hf_trainer_config",
]
