"""``ValidJob``: the job named in the path, loaded once, with its owner's name; 404 if unknown or
not the caller's to read (see :mod:`api.auth.access`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path

from api.auth.access import may_read
from api.deps import CurrentUser, SessionDep, SettingsDep
from api.jobs.service import job_not_found, load_job
from store.models import Job

JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="A job id, `job_...`")]


@dataclass(frozen=True)
class JobRef:
    job: Job
    owner: str


def valid_job(job_id: JobId, session: SessionDep, user: CurrentUser, settings: SettingsDep) -> JobRef:
    job, owner = load_job(session, job_id)
    if not may_read(user, job.owner_id, settings):
        raise job_not_found(job_id)
    return JobRef(job, owner)


ValidJob = Annotated[JobRef, Depends(valid_job)]
