"""``ValidJob``: the job named in the path, loaded once (404 if unknown), with its owner's name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path

from api.deps import CurrentUser, SessionDep
from api.jobs.service import load_job
from store.models import Job

JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="A job id, `job_...`")]


@dataclass(frozen=True)
class JobRef:
    job: Job
    owner: str


def valid_job(job_id: JobId, session: SessionDep, _user: CurrentUser) -> JobRef:
    job, owner = load_job(session, job_id)
    return JobRef(job, owner)


ValidJob = Annotated[JobRef, Depends(valid_job)]
