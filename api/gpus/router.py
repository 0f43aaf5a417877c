"""``GET /v1/gpus``: every known GPU, its live leases, what is left, why a card is out, and what each
box's probe measured; ``GET /v1/calibration``: each box's plans against what its jobs measured."""

from __future__ import annotations

from fastapi import APIRouter, Query
from pydantic import BaseModel

from api.deps import CurrentUser, SessionDep, SettingsDep
from tunebox.calibration import CalibrationReport, calibration
from tunebox.gpus import GpuStatus, list_gpus
from tunebox.probe import BoxProbeStatus, list_box_probes

router = APIRouter(tags=["gpus"])


class GpuList(BaseModel):
    items: list[GpuStatus]
    #: each box's latest probe and the figures plans for it take from it
    boxes: list[BoxProbeStatus]


@router.get("/v1/gpus", summary="GPU inventory")
def gpus(session: SessionDep, settings: SettingsDep, _user: CurrentUser) -> GpuList:
    return GpuList(items=list_gpus(session, settings), boxes=list_box_probes(session))


@router.get("/v1/calibration", summary="Planned against measured, per box")
def box_calibration(session: SessionDep, _user: CurrentUser,
                    host: str | None = Query(default=None, max_length=255)) -> CalibrationReport:
    return calibration(session, host)
