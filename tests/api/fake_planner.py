"""A stand-in for ``planner.plan`` used only while the planner is not in the tree (same interface)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from planner.errors import PlanError
from planner.spec import HardwareSpec, JobSpec

__all__ = ["Plan", "PlanError", "plan"]


class Plan(BaseModel):
    fits: bool
    margin_bytes: int
    num_gpus: int
    resolved: dict[str, Any]
    per_gpu: dict[str, Any]
    host: dict[str, Any]
    deepspeed_config: dict[str, Any]
    alternatives: list[dict[str, Any]]
    warnings: list[str]
    advice: list[str]


def _config(spec: JobSpec) -> dict[str, Any]:
    if spec.model.config is not None:
        return spec.model.config
    if spec.model.path is not None:
        return dict(json.loads((Path(spec.model.path) / "config.json").read_text()))
    raise PlanError("model.name", "unknown model")


def plan(spec: JobSpec, hardware: HardwareSpec | None = None) -> Plan:
    hw = hardware or spec.hardware
    if hw is None:
        raise PlanError("hardware", "no hardware")
    cfg = _config(spec)
    h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    params = 12 * layers * h * h + vocab * h
    per_param = 16 if spec.method.value == "full" else 2
    total = params * per_param + spec.training.seq_len * h * layers * 34
    gpus = hw.gpu_count if spec.resources.num_gpus == "auto" else int(spec.resources.num_gpus)
    need = total // gpus
    fits = need <= hw.gpu_memory_bytes and gpus <= hw.gpu_count
    alternatives = [] if fits else [{"change": {"method": "lora"}, "per_gpu_total_bytes": params * 2}]
    return Plan(fits=fits, margin_bytes=hw.gpu_memory_bytes - need, num_gpus=gpus,
                resolved={"zero_stage": 3, "micro_batch_size": 1}, per_gpu={"total_bytes": need},
                host={"total_bytes": params * 4}, deepspeed_config={"zero_optimization": {"stage": 3}},
                alternatives=alternatives, warnings=[], advice=[])
