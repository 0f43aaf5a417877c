"""DeepSpeed configuration: the user's pinned ZeRO knobs, the generated config, the HF form."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from planner.errors import PlanError
from planner.setup import Setup, ZeroKnobs

__all__ = ["PinnedDeepSpeed", "ZERO_KEYS", "build_deepspeed_config", "parse_pinned", "to_hf_trainer_config"]

#: Keys of DeepSpeed 0.19's ``DeepSpeedZeroConfig`` (aliases where it has them); the test suite
#: checks this list against the installed DeepSpeed.
ZERO_KEYS = frozenset(
    {
        "allgather_bucket_size",
        "allgather_partitions",
        "compute_grad_norm",
        "contiguous_gradients",
        "elastic_checkpoint",
        "enable_sanity_checks",
        "ignore_unused_parameters",
        "leaf_module",
        "legacy_stage1",
        "load_from_fp32_weights",
        "log_trace_cache_warnings",
        "memory_efficient_linear",
        "offload_optimizer",
        "offload_param",
        "overlap_comm",
        "override_module_apply",
        "parameter_alignment",
        "pipeline_loading_checkpoint",
        "reduce_bucket_size",
        "reduce_scatter",
        "round_robin_gradients",
        "save_muon_momentum_buffer_in_memory",
        "stage",
        "stage3_allgather_sequential",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_model_persistence_threshold",
        "stage3_module_granularity_threshold",
        "stage3_param_persistence_threshold",
        "stage3_prefetch_bucket_size",
        "stage3_use_all_reduce_for_fetch_params",
        "sub_group_size",
        "use_multi_rank_bucket_allreduce",
        "zenflow",
        "zero_hpz_partition_size",
        "zero_quantized_gradients",
        "zero_quantized_nontrainable_weights",
        "zero_quantized_weights",
    }
)
OFFLOAD_OPTIMIZER_KEYS = frozenset(
    {
        "buffer_count",
        "cpuadam_cores_perc",
        "device",
        "fast_init",
        "nvme_path",
        "pin_memory",
        "pipeline_read",
        "pipeline_write",
        "ratio",
        "super_offload",
    }
)
OFFLOAD_PARAM_KEYS = frozenset(
    {"buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"}
)
#: tunebox's shorthand: ``pin_memory`` at the top level applies to both offload targets.
_SHORTHAND = frozenset({"pin_memory"})

# ZeroKnobs field ← DeepSpeed key, for the knobs the estimator models.
_INT_KNOBS = {
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "sub_group_size": "sub_group_size",
}
_BOOL_KNOBS = {
    "overlap_comm": "overlap_comm",
    "contiguous_gradients": "contiguous_gradients",
    "pin_memory": "pin_memory",
}
_WHERE = "resources.deepspeed"
#: the DeepSpeed ``zero_optimization`` keys that ``resources.deepspeed`` pins and the estimator models
ZERO_KNOBS = frozenset(_INT_KNOBS) | frozenset(_BOOL_KNOBS)


class PinnedDeepSpeed:
    """What ``resources.deepspeed`` pins: modelled knobs, the stage, offload devices, pass-through keys."""

    def __init__(
        self,
        knobs: ZeroKnobs,
        stage: int | None,
        offload_optimizer: dict[str, Any],
        offload_param: dict[str, Any],
        passthrough: dict[str, Any],
    ) -> None:
        self.knobs = knobs
        self.stage = stage
        self.offload_optimizer = offload_optimizer
        self.offload_param = offload_param
        self.passthrough = passthrough


def _as_int(key: str, value: Any, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise PlanError(f"{where}.{key}", f"must be a whole number, got {value!r}")
    if int(value) < minimum:
        raise PlanError(f"{where}.{key}", f"must be at least {minimum}, got {value!r}")
    return int(value)


def _as_bool(key: str, value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise PlanError(f"{where}.{key}", f"must be true or false, got {value!r}")
    return value


def _offload_dict(key: str, value: Any, allowed: frozenset[str]) -> dict[str, Any]:
    where = f"{_WHERE}.{key}"
    if not isinstance(value, Mapping):
        raise PlanError(where, "must be a mapping of DeepSpeed offload settings")
    for sub in value:
        if sub not in allowed:
            raise PlanError(
                f"{where}.{sub}",
                f"DeepSpeed has no offload setting {sub!r}; known: " + ", ".join(sorted(allowed)),
            )
    device = value.get("device")
    if device is not None and device not in ("none", "cpu", "nvme"):
        raise PlanError(f"{where}.device", f"must be none, cpu or nvme, got {device!r}")
    return dict(value)


def parse_pinned(raw: Mapping[str, Any]) -> PinnedDeepSpeed:
    """Validate ``resources.deepspeed`` against DeepSpeed's ZeRO keys, naming any unknown one."""
    changes: dict[str, Any] = {}
    stage: int | None = None
    offload_opt: dict[str, Any] = {}
    offload_par: dict[str, Any] = {}
    passthrough: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in ZERO_KEYS and key not in _SHORTHAND:
            raise PlanError(f"{_WHERE}.{key}", f"DeepSpeed's zero_optimization has no setting {key!r}")
        if key in _INT_KNOBS:
            minimum = 1 if key == "reduce_bucket_size" else 0
            changes[_INT_KNOBS[key]] = _as_int(key, value, _WHERE, minimum)
        elif key in _BOOL_KNOBS:
            changes[_BOOL_KNOBS[key]] = _as_bool(key, value, _WHERE)
        elif key == "stage":
            stage = _as_int(key, value, _WHERE)
            if stage > 3:
                raise PlanError(f"{_WHERE}.stage", f"ZeRO stages are 0-3, got {stage}")
        elif key == "offload_optimizer":
            offload_opt = _offload_dict(key, value, OFFLOAD_OPTIMIZER_KEYS)
        elif key == "offload_param":
            offload_par = _offload_dict(key, value, OFFLOAD_PARAM_KEYS)
        else:
            passthrough[key] = value
    pins = [d.get("pin_memory") for d in (offload_opt, offload_par) if "pin_memory" in d]
    if pins and "pin_memory" not in changes:
        changes["pin_memory"] = _as_bool("pin_memory", pins[0], _WHERE)
    if "buffer_count" in offload_opt:
        changes["optimizer_buffer_count"] = _as_int(
            "buffer_count", offload_opt["buffer_count"], f"{_WHERE}.offload_optimizer"
        )
    for sub, field in (("buffer_count", "param_buffer_count"), ("buffer_size", "param_buffer_size")):
        if sub in offload_par:
            changes[field] = _as_int(sub, offload_par[sub], f"{_WHERE}.offload_param")
    return PinnedDeepSpeed(replace(ZeroKnobs(), **changes), stage, offload_opt, offload_par, passthrough)


def _optimizer_block(s: Setup, lr: float, weight_decay: float) -> dict[str, Any] | None:
    if s.optimizer == "adamw":
        return {
            "type": "AdamW",
            "params": {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": weight_decay},
        }
    if s.optimizer == "lion":
        return {"type": "Lion", "params": {"lr": lr, "betas": [0.9, 0.99], "weight_decay": weight_decay}}
    if s.optimizer == "sgd":
        return {"type": "SGD", "params": {"lr": lr, "momentum": 0.9, "weight_decay": weight_decay}}
    return None  # adamw_8bit: bitsandbytes' AdamW8bit is passed to deepspeed.initialize by the trainer


def _offload_block(
    device: str, pinned: Mapping[str, Any], pin: bool, nvme_path: str | None
) -> dict[str, Any]:
    block: dict[str, Any] = {k: v for k, v in pinned.items() if k not in ("device", "pin_memory")}
    block["device"] = device
    block["pin_memory"] = pin
    if device == "nvme":
        block.setdefault("nvme_path", nvme_path or "/local_nvme")
    return block


def _zero_block(s: Setup, pinned: PinnedDeepSpeed, nvme_path: str | None) -> dict[str, Any]:
    k = s.knobs
    zero: dict[str, Any] = {"stage": s.zero_stage}
    if s.zero_stage == 0:
        return zero
    zero.update(
        {
            "overlap_comm": k.overlap_comm,
            "contiguous_gradients": k.contiguous_gradients,
            "reduce_bucket_size": k.reduce_bucket_size,
            "sub_group_size": k.sub_group_size,
        }
    )
    if s.zero_stage < 3:
        zero["allgather_bucket_size"] = k.allgather_bucket_size
    else:
        zero.update(
            {
                "stage3_prefetch_bucket_size": k.prefetch_bucket_size,
                "stage3_param_persistence_threshold": k.param_persistence_threshold,
                "stage3_max_live_parameters": k.max_live_parameters,
                "stage3_max_reuse_distance": k.max_reuse_distance,
            }
        )
    if s.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload_block(
            s.offload_optimizer, pinned.offload_optimizer, k.pin_memory, nvme_path
        )
    if s.zero_stage == 3 and s.offload_param != "none":
        zero["offload_param"] = _offload_block(s.offload_param, pinned.offload_param, k.pin_memory, nvme_path)
        if s.offload_param == "nvme":
            zero["offload_param"].update(buffer_count=k.param_buffer_count, buffer_size=k.param_buffer_size)
    zero.update(pinned.passthrough)
    return zero


def build_deepspeed_config(
    s: Setup,
    pinned: PinnedDeepSpeed,
    *,
    learning_rate: float,
    weight_decay: float,
    nvme_path: str | None = None,
) -> dict[str, Any]:
    """The DeepSpeed config the worker runs: explicit numbers, accepted by ``DeepSpeedConfig``."""
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": s.micro_batch_size,
        "gradient_accumulation_steps": s.gradient_accumulation_steps,
        "train_batch_size": s.global_batch,
        "bf16": {"enabled": s.precision == "bf16"},
        "fp16": {"enabled": s.precision == "fp16"},
        "zero_optimization": _zero_block(s, pinned, nvme_path),
        "gradient_clipping": 1.0,
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    optimizer = _optimizer_block(s, learning_rate, weight_decay)
    if optimizer is not None:
        cfg["optimizer"] = optimizer
    if s.offload_optimizer != "none":
        # A trainer may hand DeepSpeed its own torch optimizer; with offload that must be allowed.
        cfg["zero_force_ds_cpu_optimizer"] = False
    if s.optimizer in ("sgd", "adamw_8bit") and s.zero_stage > 0:
        cfg["zero_allow_untested_optimizer"] = True
    return cfg


def to_hf_trainer_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The same config in the form HF Trainer expects: "auto" where TrainingArguments decides.

    Batch sizes, clipping, precision and optimizer hyper-parameters become "auto" (Trainer fills
    them from its arguments); the ZeRO knobs stay explicit, since the plan's memory depends on them.
    """
    out = copy.deepcopy(dict(cfg))
    for key in (
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "train_batch_size",
        "gradient_clipping",
    ):
        if key in out:
            out[key] = "auto"
    for key in ("bf16", "fp16"):
        if isinstance(out.get(key), dict):
            out[key]["enabled"] = "auto"
    optimizer = out.get("optimizer")
    if isinstance(optimizer, dict) and isinstance(optimizer.get("params"), dict):
        params = optimizer["params"]
        for key in ("lr", "betas", "eps", "weight_decay"):
            if key in params:
                params[key] = "auto"
    return out
