"""``GET /v1/gpus``: every known GPU, its live leases, what is left, and why a card is out."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from api.deps import CurrentUser, SessionDep, SettingsDep
from worker.gpus import GpuStatus, list_gpus

router = APIRouter(prefix="/v1/gpus", tags=["gpus"])


class GpuList(BaseModel):
    items: list[GpuStatus]


@router.get("", summary="GPU inventory")
def gpus(session: SessionDep, settings: SettingsDep, _user: CurrentUser) -> GpuList:
    return GpuList(items=list_gpus(session, settings))
