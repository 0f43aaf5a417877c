"""A whole DeepSpeed config in the Hugging Face Trainer's form, given as ``resources.deepspeed``.

Users keep configs such as LLaMA-Factory's ``examples/deepspeed/ds_z3_offload_config.json``: the
batch fields, precision blocks and ``zero_optimization`` of one DeepSpeed config, with ``"auto"``
where the HF Trainer fills a value in. :func:`absorb` turns one into the spec's own fields: the
stage and offload devices become ``resources``, the ZeRO knobs stay pinned in
``resources.deepspeed``, ``"auto"`` values are left for the planner to choose, and the batch and
precision fields are reconciled with ``training``. A value that contradicts the spec raises
:class:`ConflictingFields`, naming both places.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.dsconfig import ZERO_KEYS
from planner.errors import PlanError
from planner.spec import JobSpec

__all__ = ["ConflictingFields", "absorb", "is_whole_config"]

AUTO = "auto"
_WHERE = "resources.deepspeed"
#: top-level keys of a DeepSpeed config that tunebox reads
_BATCH = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
_PRECISION = ("bf16", "fp16")
#: top-level keys the generated config sets itself (a value other than "auto" is refused, not dropped)
_GENERATED = frozenset({"optimizer", "scheduler", "gradient_clipping"})
#: top-level keys that change nothing the plan or the run depends on
_HARMLESS = frozenset(
    {
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "steps_per_print",
        "wall_clock_breakdown",
        "prescale_gradients",
        "dump_state",
    }
)
_TOP_LEVEL = frozenset({"zero_optimization", *_BATCH, *_PRECISION}) | _GENERATED | _HARMLESS


class ConflictingFields(PlanError):
    """Two places of one spec that say different things; ``fields`` names both."""

    def __init__(self, first: str, second: str, message: str) -> None:
        super().__init__(first, message)
        self.fields = (first, second)


def is_whole_config(raw: Mapping[str, Any]) -> bool:
    """Whether ``raw`` is a whole DeepSpeed config rather than its ``zero_optimization`` block."""
    return any(key in _TOP_LEVEL and key not in ZERO_KEYS for key in raw)


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == AUTO


def _without_auto(block: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in block.items():
        if isinstance(value, Mapping):
            out[key] = _without_auto(value)
        elif not _is_auto(value):
            out[key] = value
    return out


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < 1:
        raise PlanError(where, f'must be a whole number of at least 1 or "auto", got {value!r}')
    return int(value)


class _Fields:
    """The spec's sections as plain dicts, and which of their fields the user set."""

    def __init__(self, spec: JobSpec) -> None:
        self.training = spec.training.model_dump(mode="json")
        self.resources = spec.resources.model_dump(mode="json")
        self.set = {f"training.{k}" for k in spec.training.model_fields_set} | {
            f"resources.{k}" for k in spec.resources.model_fields_set
        }

    def take(self, field: str, value: Any, source: str) -> None:
        """Set ``field`` (``training.x`` / ``resources.x``) from ``source`` unless the spec says otherwise."""
        section, key = field.split(".", 1)
        target = self.training if section == "training" else self.resources
        current = target[key]
        if field in self.set and not _is_auto(current) and current != value:
            raise ConflictingFields(field, source, f"{field} is {current!r} but {source} is {value!r}")
        target[key] = value


def _devices(zero: dict[str, Any], fields: _Fields) -> None:
    if "stage" in zero:
        stage = zero.pop("stage")
        fields.take(
            "resources.zero_stage",
            _int(stage, f"{_WHERE}.zero_optimization.stage") if stage else 0,
            f"{_WHERE}.zero_optimization.stage",
        )
    for target in ("offload_optimizer", "offload_param"):
        block = zero.get(target)
        if isinstance(block, dict) and "device" in block:
            fields.take(
                f"resources.{target}", block.pop("device"), f"{_WHERE}.zero_optimization.{target}.device"
            )
            if not block:
                zero.pop(target)


def _batch(raw: Mapping[str, Any], fields: _Fields) -> None:
    micro, accum, total = (raw.get(k, AUTO) for k in _BATCH)
    if not _is_auto(micro):
        where = f"{_WHERE}.{_BATCH[0]}"
        fields.take("training.micro_batch_size", _int(micro, where), where)
    if not _is_auto(accum):
        fields.take(
            "training.gradient_accumulation_steps",
            _int(accum, f"{_WHERE}.{_BATCH[1]}"),
            f"{_WHERE}.{_BATCH[1]}",
        )
    if _is_auto(total):
        return
    total_field = f"{_WHERE}.train_batch_size"
    total = _int(total, total_field)
    micro, accum = fields.training["micro_batch_size"], int(fields.training["gradient_accumulation_steps"])
    gpus = fields.resources["num_gpus"]
    if _is_auto(micro) and _is_auto(gpus):
        raise ConflictingFields(
            total_field,
            "training.micro_batch_size",
            "train_batch_size is micro batch "
            "x accumulation x GPUs: set training.micro_batch_size or resources.num_gpus",
        )
    if _is_auto(micro):
        micro_field, per_step = "training.micro_batch_size", accum * int(gpus)
        if total % per_step:
            raise ConflictingFields(
                total_field,
                "training.gradient_accumulation_steps",
                f"train_batch_size {total} is not a multiple of accumulation x GPUs ({per_step})",
            )
        fields.take(micro_field, total // per_step, total_field)
    elif _is_auto(gpus):
        per_gpu = int(micro) * accum
        if total % per_gpu:
            raise ConflictingFields(
                total_field,
                "training.micro_batch_size",
                f"train_batch_size {total} is not a multiple of micro batch x accumulation ({per_gpu})",
            )
        fields.take("resources.num_gpus", total // per_gpu, total_field)
    elif total != int(micro) * accum * int(gpus):
        raise ConflictingFields(
            total_field,
            "training.micro_batch_size",
            f"train_batch_size {total} is not micro batch {micro} x accumulation {accum} x {gpus} GPUs",
        )


def _precision(raw: Mapping[str, Any], fields: _Fields) -> None:
    enabled = [
        name for name in _PRECISION if isinstance(raw.get(name), Mapping) and raw[name].get("enabled") is True
    ]
    if len(enabled) == 2:
        raise ConflictingFields(
            f"{_WHERE}.bf16.enabled", f"{_WHERE}.fp16.enabled", "bf16 and fp16 are both enabled"
        )
    if enabled:
        fields.take("training.precision", enabled[0], f"{_WHERE}.{enabled[0]}.enabled")


def _refuse_generated(raw: Mapping[str, Any]) -> None:
    """Keys tunebox does not read must be "auto" (the HF Trainer's "fill it in"), never dropped unread."""
    for key, value in raw.items():
        if key in ("zero_optimization", *_BATCH, *_PRECISION) or key in _HARMLESS:
            continue  # read above; the precision blocks' loss-scale settings are DeepSpeed's own
        if key not in _GENERATED:
            raise PlanError(
                f"{_WHERE}.{key}",
                f"tunebox does not take the DeepSpeed setting {key!r} "
                "(it reads zero_optimization, the batch sizes and bf16/fp16)",
            )
        params = value.get("params", {}) if isinstance(value, Mapping) else {}
        if _is_auto(value) or (
            isinstance(params, Mapping) and not _without_auto(params) and set(value) <= {"type", "params"}
        ):
            continue
        raise PlanError(
            f"{_WHERE}.{key}",
            f'tunebox generates {key!r} from the spec\'s training fields; give it as "auto" or leave it out',
        )


def absorb(spec: JobSpec) -> JobSpec:
    """``spec`` with a DeepSpeed config in ``resources.deepspeed`` turned into its own fields."""
    raw = spec.resources.deepspeed
    if not raw:
        return spec
    whole = is_whole_config(raw)
    if whole:
        _refuse_generated(raw)
    zero_raw = raw.get("zero_optimization", {}) if whole else raw
    if not isinstance(zero_raw, Mapping):
        raise PlanError(f"{_WHERE}.zero_optimization", "must be a mapping of ZeRO settings")
    fields = _Fields(spec)
    zero = _without_auto(zero_raw)
    if whole:
        _devices(zero, fields)
        _batch(raw, fields)
        _precision(raw, fields)
    fields.resources["deepspeed"] = zero
    return spec.model_copy(
        update={
            "training": type(spec.training).model_validate(fields.training),
            "resources": type(spec.resources).model_validate(fields.resources),
        }
    )
