"""Planning for the API: the hardware a spec is planned against, and planner errors as 422s."""

from __future__ import annotations

from typing import TYPE_CHECKING

from api.errors import InvalidInput, ServiceUnavailable
from api.paths import confine
from planner.spec import HardwareSpec, JobSpec

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from planner import Plan
    from tunebox.settings import Settings


def hardware_for(spec: JobSpec, session: Session, settings: Settings) -> HardwareSpec:
    """``spec.hardware`` (what-if planning) or this box's GPUs and host memory."""
    if spec.hardware is not None:
        return spec.hardware
    from worker.gpus import NoGpuError, box_hardware

    try:
        return box_hardware(session, settings)
    except NoGpuError as exc:
        raise ServiceUnavailable(str(exc), errors=[{"field": "hardware", "message": str(exc)}]) from exc


def make_plan(spec: JobSpec, hardware: HardwareSpec) -> Plan:
    from planner import PlanError, plan

    try:
        return plan(spec, hardware=hardware)
    except PlanError as exc:
        raise InvalidInput.for_field(exc.field, exc.message) from exc


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
