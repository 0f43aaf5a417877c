"""``POST /v1/plans``: the plan for a spec, on this box or on the spec's ``hardware``."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentUser, SessionDep, SettingsDep
from api.plans.service import absorb_deepspeed_config, check_storable, hardware_for, make_plan, resolve_model
from planner import Plan
from planner.spec import JobSpec

router = APIRouter(prefix="/v1/plans", tags=["plans"])


@router.post("", summary="Plan a job spec without submitting it")
def create_plan(spec: JobSpec, session: SessionDep, settings: SettingsDep,
                _user: CurrentUser) -> Plan:
    check_storable(spec)
    spec = absorb_deepspeed_config(spec)
    spec = resolve_model(spec, settings, required=False)
    plan = make_plan(spec, hardware_for(spec, session, settings))
    return plan
