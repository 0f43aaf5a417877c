"""``/v1/jobs``: thin handlers over :mod:`api.jobs.service`."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path as PathLib
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.auth.access import may_read
from api.auth.service import Principal
from api.deps import (
    AdminUser,
    CurrentUser,
    Reader,
    SessionDep,
    SettingsDep,
    after_commit,
    finish_now,
    first_row,
    in_write_session,
)
from api.errors import (
    ApiError,
    FieldError,
    InvalidInput,
    ServiceUnavailable,
    TooManyRequests,
    retry_after_header,
)
from api.jobs import archive, idempotency, logs, service
from api.jobs.deps import JobId, JobRef, ValidJob
from api.jobs.schemas import (
    CheckpointList,
    EventList,
    JobCreate,
    JobList,
    JobRead,
    JobUpdate,
    MetricKind,
    MetricSeries,
    Queue,
)
from api.jobs.stream import event_stream
from api.workers import WorkerWatch
from store.models import Job, User
from store.states import JobStatus
from tunebox.settings import Settings

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
queue_router = APIRouter(tags=["jobs"])


@queue_router.get("/v1/queue", summary="The queued jobs in the order they will start")
def queue(session: SessionDep, user: CurrentUser, settings: SettingsDep,
          limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> Queue:
    return service.queue(session, user, settings, limit)

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"description": text, "content": {"application/problem+json": {}}}
    for code, text in [(401, "No or bad token"), (404, "Unknown job"),
                       (422, "Invalid spec, or the job does not fit (body carries plan and alternatives)")]
}


async def submit_allowance(request: Request, user: Reader) -> Principal:
    """The per-token submission rate (token bucket): 429 with Retry-After when spent; 503 while the
    embedded worker cannot run jobs (they would wait in the queue for nothing)."""
    if (problem := request.app.state.worker_problem()) is not None:
        raise ServiceUnavailable(problem, errors=[FieldError("worker", problem)])
    wait = request.app.state.submit_buckets.take(user.token_id)
    if wait > 0:
        raise TooManyRequests(f"more than {request.app.state.settings.submit_rate_per_minute} submissions "
                              "a minute with this token", headers=retry_after_header(wait))
    return user


Submitter = Annotated[Principal, Depends(submit_allowance)]


@router.post("", status_code=201, response_model=JobRead, summary="Submit a job",
             responses={**_PROBLEMS, 409: {"description": "Same Idempotency-Key still in flight"},
                        429: {"description": "Too many queued jobs or submissions"}})
async def create_job(
    spec: JobCreate, request: Request, user: Submitter,
    idempotency_key: Annotated[str | None, Header(alias=idempotency.HEADER)] = None,
) -> Response:
    # all the blocking work, the commit and the enqueue in one worker thread, in one transaction:
    # each hop between the event loop and a thread costs more CPU than most of the steps it would carry
    state = request.app.state
    return await in_write_session(request, _submit, state.settings, user, spec, idempotency_key,
                                  state.enqueue, state.worker_watch)


def _submit(session: Session, settings: Settings, user: Principal, spec: JobCreate, key: str | None,
            enqueue: service.Enqueue, watch: WorkerWatch) -> Response:
    if key is not None:
        replay = idempotency.claim(session, user.user_id, key,
                                   idempotency.fingerprint(spec.model_dump(mode="json", exclude_unset=True)))
        if replay is not None:
            finish_now(session)
            return JSONResponse(replay.body, status_code=replay.status,
                                headers={"Idempotent-Replayed": "true"})
    try:
        job, task_id = service.create_job(session, settings, user, spec, watch)
    except ApiError:
        if key is not None:
            idempotency.release(session, user.user_id, key)
        raise
    if key is not None:
        idempotency.complete(session, user.user_id, key, 201, json.loads(job.body), job.id)
    after_commit(session, partial(service.dispatch, enqueue, job.id, job.priority, task_id))
    finish_now(session)  # commit, then enqueue: the client never sees a 201 for an uncommitted job
    # the body is JobRead's JSON already (service.create_job), sent as it is
    return Response(job.body, status_code=201, media_type="application/json",
                    headers={"Location": f"/v1/jobs/{job.id}"})


@router.get("", summary="List jobs, newest first")
def list_jobs(
    session: SessionDep, user: CurrentUser, settings: SettingsDep,
    status: Annotated[list[JobStatus], Query(description="Repeat to match several.")] = [],  # noqa: B006
    owner: Annotated[str | None, Query(pattern=r"^[^\x00-\x1f]{1,100}$",
                                       description="A user name, or `me`.")] = None,
    after: Annotated[str | None, Query(pattern=r"^job_[0-9a-z]{1,40}$",
                                       description="`next_after` of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    model: Annotated[str | None, Query(min_length=1, max_length=255,
                                       description="The model as the list shows it.")] = None,
) -> JobList:
    return service.list_jobs(session, user, statuses=status, owner=owner, after=after, limit=limit,
                             settings=settings, model=model)


# one job with its owner's name, as plain columns: a Core row is all that JobRead needs
_JOB_WITH_OWNER = (select(*service.job_read_columns(), User.name.label("owner_name"))
                   .join(User, User.id == Job.owner_id).where(Job.id == bindparam("job_id")))


@router.get("/{job_id}", summary="One job", response_model=JobRead, responses=_PROBLEMS)
async def get_job(job_id: JobId, request: Request, user: Reader) -> Response:
    row = await first_row(request, _JOB_WITH_OWNER, {"job_id": job_id})
    if row is None or not may_read(user, row.owner_id, request.app.state.settings):
        raise service.job_not_found(job_id)
    return Response(service.job_read_json(row, row.owner_name), media_type="application/json")


@router.post("/{job_id}/cancel", summary="Cancel a job", responses={
    **_PROBLEMS, 202: {"description": "Cancelling: the worker stops the run"},
    403: {"description": "Not the owner nor an admin"}, 409: {"description": "Already finished"}})
def cancel_job(job_id: JobId, session: SessionDep, user: CurrentUser, response: Response) -> JobRead:
    job, done = service.cancel_job(session, user, job_id)
    response.status_code = 200 if done else 202
    return job


@router.post("/{job_id}/pause", summary="Pause a job: checkpoint at the next step, free its GPUs",
             responses={**_PROBLEMS, 202: {"description": "Pausing: the training checkpoints and ends"},
                        403: {"description": "Not the owner nor an admin"},
                        409: {"description": "Not running"}})
def pause_job(job_id: JobId, session: SessionDep, user: CurrentUser, response: Response) -> JobRead:
    job = service.pause_job(session, user, job_id)
    response.status_code = 200 if job.status is JobStatus.PAUSED else 202
    return job  # pausing: the worker moves it to paused once the checkpoint is saved


@router.post("/{job_id}/resume", summary="Resume a paused job from its checkpoint",
             responses={**_PROBLEMS, 403: {"description": "Not the owner nor an admin"},
                        409: {"description": "Not paused"}})
def resume_job(job_id: JobId, request: Request, session: SessionDep, user: CurrentUser) -> JobRead:
    job = service.resume_job(session, user, job_id)
    after_commit(session, partial(service.dispatch, request.app.state.enqueue, job.id, job.priority,
                                  service.new_task_id()))
    return job


@router.patch("/{job_id}", summary="Change a job's priority (admin)", responses=_PROBLEMS)
def update_job(job_id: JobId, body: JobUpdate, session: SessionDep, admin: AdminUser) -> JobRead:
    return service.set_priority(session, admin, job_id, body.priority)


@router.get("/{job_id}/events", summary="A job's events (JSON, or SSE with Accept: text/event-stream)",
            response_model=EventList, responses={**_PROBLEMS, 200: {
                "content": {"application/json": {}, "text/event-stream": {}}}})
async def job_events(
    request: Request, session: SessionDep, ref: ValidJob,
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
) -> EventList | Response:
    job_id = ref.job.id
    if "text/event-stream" not in request.headers.get("accept", ""):
        return await run_in_threadpool(service.list_events, session, job_id, after, limit)
    start = after
    if last_event_id:
        if not last_event_id.isdigit():
            raise InvalidInput("Last-Event-ID must be an event id",
                               errors=[FieldError("Last-Event-ID", "not an event id")])
        start = int(last_event_id)
    stream = event_stream(request.app.state.read_sessions, job_id, start, request.app.state.stream_timing,
                          request.is_disconnected)
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/{job_id}/metrics", summary="Loss, learning rate, throughput and memory series")
def job_metrics(
    session: SessionDep, ref: ValidJob,
    kind: Annotated[MetricKind, Query()] = "train",
    after_step: Annotated[int | None, Query(ge=-1, le=2**31)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 2000,
) -> MetricSeries:
    return service.metric_series(session, ref.job.id, kind, after_step, limit)


@router.get("/{job_id}/checkpoints", summary="Checkpoints of a job")
def job_checkpoints(session: SessionDep, ref: ValidJob) -> CheckpointList:
    return service.list_checkpoints(session, ref.job.id)


@router.get("/{job_id}/checkpoints/{step}/archive", summary="A checkpoint as .tar.gz (adapter or model)",
            response_class=StreamingResponse, responses=_PROBLEMS)
def checkpoint_archive(
    session: SessionDep, ref: ValidJob, step: Annotated[int, Path(ge=0, le=2**31)],
    with_state: Annotated[bool, Query(description="Include DeepSpeed's resume state (ds/).")] = False,
) -> StreamingResponse:
    return _archive(session, ref, step, with_state)


@router.get("/{job_id}/adapter", summary="The final adapter (or model) as .tar.gz",
            response_class=StreamingResponse, responses=_PROBLEMS)
def final_archive(session: SessionDep, ref: ValidJob) -> StreamingResponse:
    return _archive(session, ref, None, False)


def _archive(session: Session, ref: JobRef, step: int | None, with_state: bool) -> StreamingResponse:
    found = archive.find_checkpoint(session, ref.job.id, step)
    name = f"{ref.job.id}-step-{found.step}"
    body = archive.build(PathLib(found.path), name, with_state=with_state)

    def chunks() -> Any:
        with body:
            while chunk := body.read(1 << 20):
                yield chunk

    return StreamingResponse(chunks(), media_type="application/gzip", headers={
        "Content-Disposition": f'attachment; filename="{name}.tar.gz"', "X-Checkpoint-Step": str(found.step)})


@router.get("/{job_id}/logs", summary="The training log (text); `tail` lines, `follow` as it grows",
            response_class=PlainTextResponse, responses=_PROBLEMS)
async def job_logs(
    request: Request, ref: ValidJob,
    tail: Annotated[int | None, Query(ge=0, le=10**7, description="Only the last N lines.")] = None,
    follow: Annotated[bool, Query(description="Keep sending what is written until the job ends.")] = False,
) -> StreamingResponse:
    sessions = request.app.state.read_sessions
    log = await run_in_threadpool(logs.open_log, sessions, ref.job.id, ref.job.job_dir, tail)
    text = logs.log_text(sessions, ref.job.id, log, follow=follow, disconnected=request.is_disconnected,
                         poll_s=request.app.state.stream_timing.poll_s)
    return StreamingResponse(text, media_type="text/plain; charset=utf-8",
                             headers={"X-Log-Source": log.source, "Cache-Control": "no-cache",
                                      "X-Accel-Buffering": "no"})
