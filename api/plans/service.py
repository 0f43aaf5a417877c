"""Planning for the API: the hardware a spec is planned against, and planner errors as 422s."""

from __future__ import annotations

import importlib.util
import math
from typing import TYPE_CHECKING, Any

from api.errors import PLAN_REFUSALS, FieldError, InvalidInput, ServiceUnavailable
from api.paths import confine
from planner.spec import HardwareSpec, JobSpec

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from planner import Plan
    from tunebox.settings import Settings


def _bad_value(value: Any, path: str) -> tuple[str, str] | None:
    """The first value JSON storage cannot hold: NaN/Infinity (not JSON) or NUL (Postgres text)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, "must be a finite number"
    if isinstance(value, str) and "\x00" in value:
        return path, "contains a NUL character"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _bad_value(key, path) or _bad_value(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            if found := _bad_value(item, f"{path}[{i}]"):
                return found
    return None


def check_storable(spec: JobSpec) -> None:
    """Free-form parts of a spec (``model.config``, ``resources.deepspeed``) are checked here."""
    found = _bad_value(spec.model_dump(mode="python"), "")
    if found:
        raise InvalidInput.for_field(*found)


def absorb_deepspeed_config(spec: JobSpec) -> JobSpec:
    """A whole DeepSpeed config (the HF Trainer's form) in ``resources.deepspeed`` as the spec's fields."""
    from planner import PlanError
    from planner.hfdeepspeed import ConflictingFields, absorb

    try:
        return absorb(spec)
    except ConflictingFields as exc:
        raise InvalidInput(exc.message, errors=[FieldError(f, exc.message) for f in exc.fields]) from exc
    except PlanError as exc:
        raise InvalidInput.for_field(exc.field, exc.message) from exc


def hardware_for(spec: JobSpec, session: Session, settings: Settings) -> HardwareSpec:
    """``spec.hardware`` (what-if planning) or this box's GPUs and host memory."""
    if spec.hardware is not None:
        return spec.hardware
    from tunebox.gpus import NoGpuError, box_hardware

    try:
        hardware = box_hardware(session, settings)
    except NoGpuError as exc:
        message = (f"{exc}: for example TUNEBOX_GPU_COUNT=1 TUNEBOX_GPU_MEMORY_BYTES={16 * 2**30} (16 GiB), "
                   "then restart the server")
        raise ServiceUnavailable(message, errors=[{"field": "hardware", "message": message}]) from exc
    if hardware.qlora_unavailable is None and importlib.util.find_spec("bitsandbytes") is None:
        # QLoRA's 4-bit layers come from bitsandbytes; found without importing it (no torch here)
        hardware = hardware.model_copy(update={"qlora_unavailable": "bitsandbytes is not installed"})
    return hardware


def make_plan(spec: JobSpec, hardware: HardwareSpec) -> Plan:
    from planner import PlanError, plan

    try:
        return plan(spec, hardware=hardware)
    except PlanError as exc:
        raise refusal(exc.code, exc.field, exc.message) from exc


def refusal(code: str, field: str, message: str) -> InvalidInput:
    """A planner refusal as problem+json: its own problem type where it has one, the field named."""
    cls = PLAN_REFUSALS.get(code, InvalidInput)
    return cls(f"{field}: {message}", errors=[FieldError(field, message, code=code)])


def resolve_model(spec: JobSpec, settings: Settings, *, required: bool) -> JobSpec:
    """Replace ``model.path`` by its resolved path under a model root; a job needs one."""
    if spec.model.path is None:
        if required:
            raise InvalidInput.for_field("model.path", "a job needs a local model folder (model.path); "
                                         "model.name and model.config are for planning only")
        return spec
    real = confine(spec.model.path, settings.model_roots, "model.path")
    if not (real / "config.json").is_file():
        raise InvalidInput.for_field("model.path", f"{spec.model.path} has no config.json")
    return spec.model_copy(update={"model": spec.model.model_copy(update={"path": str(real)})})
