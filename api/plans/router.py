"""``POST /v1/plans``: the plan for a spec, on this box or on the spec's ``hardware``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import CurrentUser, SessionDep, SettingsDep
from api.plans.service import hardware_for, make_plan
from planner.spec import JobSpec

router = APIRouter(prefix="/v1/plans", tags=["plans"])


@router.post("", summary="Plan a job spec without submitting it")
def create_plan(spec: JobSpec, session: SessionDep, settings: SettingsDep,
                _user: CurrentUser) -> dict[str, Any]:
    plan = make_plan(spec, hardware_for(spec, session, settings))
    return plan.model_dump(mode="json")
