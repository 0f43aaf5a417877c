"""``/v1/fine_tuning/jobs``: OpenAI's fine-tuning jobs over tunebox's (create, list, retrieve, cancel,
pause, resume, events, checkpoints)."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.auth.service import Principal
from api.deps import CurrentUser, SessionDep, SettingsDep, after_commit, finish_now
from api.errors import ApiError
from api.jobs import idempotency
from api.jobs import service as jobs
from api.jobs.router import Submitter
from api.openai import service
from api.openai.errors import OpenAIRoute
from api.openai.schemas import FineTuningJobCreate
from api.workers import WorkerWatch
from store import jobs as job_rows
from tunebox.settings import Settings

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["openai"], route_class=OpenAIRoute)

JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
After = Annotated[str | None, Query(max_length=64)]
Limit = Annotated[int, Query(ge=1, le=1000)]


@router.post("", summary="Create a fine-tuning job (idempotent under the SDK's retries)")
async def create_job(
    body: FineTuningJobCreate,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    user: Submitter,
    idempotency_key: Annotated[str | None, Header(alias=idempotency.HEADER)] = None,
    retries_taken: Annotated[int, Header(alias="X-Stainless-Retry-Count", ge=0, le=1000)] = 0,
) -> dict[str, Any]:
    state = request.app.state
    return await run_in_threadpool(
        _create, session, settings, user, body, idempotency_key, retries_taken, state.enqueue,
        state.worker_watch,
    )


def _create(
    session: Session,
    settings: Settings,
    user: Principal,
    body: FineTuningJobCreate,
    explicit_key: str | None,
    retries_taken: int,
    enqueue: jobs.Enqueue,
    watch: WorkerWatch,
) -> dict[str, Any]:
    spec = service.spec_from_request(body)
    body_hash = service.fingerprint(body)
    key = service.retry_key(session, user, explicit_key, body_hash, retries_taken)
    replay = idempotency.claim(session, user.user_id, key, body_hash)
    if replay is not None:
        job, owner = service.readable_job(session, settings, user, str(replay.body["id"]))
        obj = service.job_object(job, owner)
        finish_now(session)
        return obj
    try:
        created, task_id = jobs.create_job(session, settings, user, spec, watch)
    except ApiError:
        idempotency.release(session, user.user_id, key)
        raise
    asked = body.model_dump(mode="json", exclude_none=True, exclude={"tunebox"})
    job_rows.set_fields(session, created.id, openai_request=asked)
    job, owner = service.readable_job(session, settings, user, created.id)
    obj = service.job_object(job, owner)
    idempotency.complete(session, user.user_id, key, 200, {"id": job.id}, job.id)
    after_commit(session, partial(jobs.dispatch, enqueue, job.id, job.priority, task_id))
    finish_now(session)
    return obj


@router.get("", summary="Your fine-tuning jobs, newest first")
def list_jobs(
    session: SessionDep,
    settings: SettingsDep,
    user: CurrentUser,
    after: After = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
) -> dict[str, Any]:
    return service.list_jobs(session, settings, user, after, limit)


@router.get("/{fine_tuning_job_id}", summary="One fine-tuning job")
def retrieve_job(
    fine_tuning_job_id: JobId, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> dict[str, Any]:
    return service.job_object(*service.readable_job(session, settings, user, fine_tuning_job_id))


def _changed(session: Session, settings: Settings, user: Principal, job_id: str) -> dict[str, Any]:
    session.expire_all()
    return service.job_object(*service.readable_job(session, settings, user, job_id))


@router.post("/{fine_tuning_job_id}/cancel", summary="Cancel a fine-tuning job")
def cancel_job(
    fine_tuning_job_id: JobId, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> dict[str, Any]:
    service.readable_job(session, settings, user, fine_tuning_job_id)
    jobs.cancel_job(session, user, fine_tuning_job_id)
    return _changed(session, settings, user, fine_tuning_job_id)


@router.post("/{fine_tuning_job_id}/pause", summary="Pause a fine-tuning job at its next step")
def pause_job(
    fine_tuning_job_id: JobId, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> dict[str, Any]:
    service.readable_job(session, settings, user, fine_tuning_job_id)
    jobs.pause_job(session, user, fine_tuning_job_id)
    return _changed(session, settings, user, fine_tuning_job_id)


@router.post("/{fine_tuning_job_id}/resume", summary="Resume a paused fine-tuning job")
def resume_job(
    fine_tuning_job_id: JobId, request: Request, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> dict[str, Any]:
    service.readable_job(session, settings, user, fine_tuning_job_id)
    resumed = jobs.resume_job(session, user, fine_tuning_job_id)
    after_commit(
        session,
        partial(jobs.dispatch, request.app.state.enqueue, resumed.id, resumed.priority, jobs.new_task_id()),
    )
    return _changed(session, settings, user, fine_tuning_job_id)


@router.get("/{fine_tuning_job_id}/events", summary="A fine-tuning job's events, newest first")
def list_events(
    fine_tuning_job_id: JobId,
    session: SessionDep,
    settings: SettingsDep,
    user: CurrentUser,
    after: After = None,
    limit: Limit = 20,
) -> dict[str, Any]:
    job, _ = service.readable_job(session, settings, user, fine_tuning_job_id)
    return service.list_events(session, job, after, limit)


@router.get("/{fine_tuning_job_id}/checkpoints", summary="A fine-tuning job's checkpoints, newest first")
def list_checkpoints(
    fine_tuning_job_id: JobId,
    session: SessionDep,
    settings: SettingsDep,
    user: CurrentUser,
    after: After = None,
    limit: Limit = 10,
) -> dict[str, Any]:
    job, _ = service.readable_job(session, settings, user, fine_tuning_job_id)
    return service.list_checkpoints(session, job, after, limit)
