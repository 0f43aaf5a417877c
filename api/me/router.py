"""``GET /v1/me``: who the token belongs to, and what it may read and change."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.auth.access import sees_everything
from api.deps import CurrentUser, SettingsDep

router = APIRouter(prefix="/v1/me", tags=["me"])


class Me(BaseModel):
    name: str
    is_admin: bool
    reads_all_jobs: bool = Field(
        description="Whether every job's details are readable with this token "
        "(an admin, or a box that opens them to the team)."
    )


@router.get("", summary="The caller")
def me(user: CurrentUser, settings: SettingsDep) -> Me:
    return Me(name=user.name, is_admin=user.is_admin, reads_all_jobs=sees_everything(user, settings))
