"""Job use cases. Functions take the request's session and ``flush()``; the session dependency commits."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from pydantic_core import to_json
from sqlalchemy import Row, Text, bindparam, cast, literal, select
from sqlalchemy.orm import Session

from api.auth.access import may_read, may_use_dataset, sees_everything
from api.auth.service import Principal
from api.errors import (
    Conflict,
    FieldError,
    Forbidden,
    InvalidInput,
    NotFound,
    PlanDoesNotFit,
    TooManyRequests,
)
from api.jobs.schemas import (
    CheckpointList,
    CheckpointRead,
    EventList,
    EventRead,
    Failure,
    JobList,
    JobRead,
    JobSummary,
    MetricKind,
    MetricPointRead,
    MetricSeries,
    Progress,
    Queue,
)
from api.paths import confine
from api.plans.service import (
    absorb_deepspeed_config,
    check_storable,
    hardware_for,
    make_plan,
    refusal,
    resolve_model,
)
from api.workers import WorkerWatch
from planner import Plan
from planner.constants import GIB
from planner.spec import DataSource, JobSpec
from store import checkpoints, events, jobs, metrics
from store.base import utcnow
from store.dataset_reports import find_report
from store.ids import new_id
from store.models import Dataset, Job, JobEvent
from store.queue import queued_in_run_order
from store.states import IllegalTransition, JobStatus, transition
from tunebox.settings import Settings

log = logging.getLogger(__name__)

Enqueue = Callable[..., str]
#: a job as ORM object, Core row of the jobs table's columns, or object with the same attributes
JobLike = Job | Row[Any] | SimpleNamespace


# --------------------------------------------------------------------------- reading


def _progress(job: JobLike) -> Progress:
    return Progress(step=job.step, total_steps=job.total_steps, epoch=job.epoch, loss=job.loss,
                    learning_rate=job.learning_rate, tokens_per_second=job.tokens_per_second,
                    samples_per_second=job.samples_per_second, eta_seconds=job.eta_seconds,
                    measured_peak_gpu_bytes=job.measured_peak_gpu_bytes,
                    measured_host_rss_bytes=job.measured_host_rss_bytes,
                    host_cpu_percent=job.host_cpu_percent, updated_at=job.progress_at)


def _failure(job: JobLike) -> Failure | None:
    if job.failure_kind is None and job.failure_reason is None:
        return None
    return Failure(kind=job.failure_kind, reason=job.failure_reason, message=job.failure_message)


def model_label(spec: JobSpec) -> str | None:
    """The model as lists show and filter it: the catalogue name, the folder's name, or what a
    config names."""
    model = spec.model
    if model.name:
        return model.name[:255]
    if model.path:
        return model.path.rstrip("/").rsplit("/", 1)[-1][:255] or None
    config = model.config or {}
    return str(config.get("_name_or_path") or config.get("model_type") or "")[:255] or None


def _summary_fields(job: JobLike, owner: str) -> dict[str, Any]:
    return dict(id=job.id, name=job.name, owner=owner, status=job.status, priority=job.priority,
                model=job.model,
                num_gpus=job.num_gpus, planned_peak_gpu_bytes=job.planned_peak_gpu_bytes,
                planned_host_bytes=job.planned_host_bytes, progress=_progress(job), failure=_failure(job),
                created_at=job.created_at, updated_at=job.updated_at, started_at=job.started_at,
                finished_at=job.finished_at)


def job_summary(job: Job, owner: str, *, details: bool = True) -> JobSummary:
    """``details`` False: the queue's view of someone else's job, without its progress or failure."""
    fields = _summary_fields(job, owner)
    if not details:
        fields.update(progress=None, failure=None, model=None)
    return JobSummary(**fields)


def _read_fields(job: JobLike, owner: str) -> dict[str, Any]:
    return dict(**_summary_fields(job, owner), spec=job.spec, plan=job.plan, dataset_id=job.dataset_id,
                attempt=job.attempt, worker_host=job.worker_host, gpu_indices=job.gpu_indices,
                cancel_requested_at=job.cancel_requested_at, eval_status=job.eval_status,
                eval_result=job.eval_result, log_tail=job.log_tail, data_report=job.data_report)


def job_read(job: Job | Row[Any], owner: str) -> JobRead:
    """``job`` is a Job, or a Core row of the jobs table's columns (the same names)."""
    return JobRead(**_read_fields(job, owner))


#: the JSON columns of a job that ``job_read_json`` passes through as stored, and what stands in
#: for each while the other fields are validated and written
RAW_JSON_FIELDS: dict[str, Any] = {"spec": {}, "plan": {}, "eval_result": None, "data_report": None}
#: columns of the jobs table no JobRead shows
_UNREAD_COLUMNS = frozenset({"eval_dataset_id", "celery_task_id", "worker_pid", "process_group", "job_dir",
                             "openai_request", "dispatch_checked_at"})


def job_read_columns() -> list[Any]:
    """What ``job_read_json`` reads of a job: the columns JobRead shows, its JSON ones as their
    stored text."""
    return [cast(c, Text).label(c.name) if c.name in RAW_JSON_FIELDS else c
            for c in Job.__table__.c if c.name not in _UNREAD_COLUMNS]


def job_read_json(row: Row[Any] | SimpleNamespace, owner: str) -> bytes:
    """``job_read``'s JSON for a row of ``job_read_columns`` (or an object with the same attributes):
    the JSON columns go into the body as the database holds them instead of being parsed, validated
    and written again (most of what a read of a job cost)."""
    head = JobRead(**{**_read_fields(row, owner), **RAW_JSON_FIELDS})
    parts = [head.model_dump_json(exclude=set(RAW_JSON_FIELDS)).encode()[:-1]]
    for name in RAW_JSON_FIELDS:
        text = getattr(row, name)
        parts.append(f',"{name}":'.encode() + (b"null" if text is None else text.encode()))
    parts.append(b"}")
    return b"".join(parts)


def load_job(session: Session, job_id: str) -> tuple[Job, str]:
    """The job and its owner's name, or 404."""
    found = jobs.with_owner(session, job_id)
    if found is None:
        raise job_not_found(job_id)
    return found


def job_not_found(job_id: str) -> NotFound:
    return NotFound(f"no job {job_id}", errors=[FieldError("job_id", "no such job")])


def list_jobs(session: Session, user: Principal, *, statuses: Sequence[JobStatus], owner: str | None,
              after: str | None, limit: int, settings: Settings, model: str | None = None) -> JobList:
    """Newest first; ``after`` is the last id of the previous page (ids sort by creation time).

    Everyone sees the whole queue; the model, progress and failure of a job are only there for those
    who may read its details (:func:`api.auth.access.may_read`), and ``model`` filters among those.
    """
    own = owner == "me" or (model is not None and not sees_everything(user, settings))
    rows = jobs.newest_first(session, limit + 1, after=after or None, statuses=statuses,
                             owner_id=user.user_id if own else None,
                             owner_name=owner if owner and owner != "me" else None, model=model)
    items = [job_summary(job, name, details=may_read(user, job.owner_id, settings))
             for job, name in rows[:limit]]
    return JobList(items=items, next_after=items[-1].id if len(rows) > limit else None)


def queue(session: Session, user: Principal, settings: Settings, limit: int) -> Queue:
    """The queued jobs in start order; another's job as the queue shows it (no details)."""
    rows = session.execute(jobs.summaries(queued_in_run_order()).limit(limit + 1)).all()
    items = [job_summary(job, name, details=may_read(user, job.owner_id, settings))
             for job, name in rows[:limit]]
    more = 0
    if len(rows) > limit:
        more = jobs.count_with_status(session, JobStatus.QUEUED) - limit
    return Queue(items=items, more=more)


# --------------------------------------------------------------------------- submitting


# what a submission needs of a stored dataset (a Core row: no ORM object on this path)
_DATASET_COLUMNS = (Dataset.id, Dataset.owner_id, Dataset.shared, Dataset.num_rows, Dataset.path)
_DATASET_FOR_JOB = select(*_DATASET_COLUMNS).where(Dataset.id == bindparam("dataset_id"))
# the owner's queued jobs (counted up to the limit) and the dataset the job names, in one round trip:
# one row whatever the dataset (its columns are NULL where there is none)
_QUEUED_AND_DATASET = select(jobs.queued_of_owner_count().label("queued"), *_DATASET_COLUMNS).select_from(
    select(literal(1).label("one")).subquery().outerjoin(Dataset, Dataset.id == bindparam("dataset_id")))


def _check_queue_limit(session: Session, user: Principal, settings: Settings, dataset_id: str | None
                       ) -> Row[Any] | None:
    """429 when the user's queued jobs reach the limit; otherwise the row of the stored dataset
    ``dataset_id`` names (None if there is none), read by the same statement."""
    limit = user.max_queued_jobs or settings.max_queued_jobs_per_user
    row = session.connection().execute(_QUEUED_AND_DATASET, {"owner_id": user.user_id, "limit": limit,
                                                             "dataset_id": dataset_id}).one()
    if row.queued >= limit:
        raise TooManyRequests(f"{user.name} already has {limit} queued jobs (the limit); wait or cancel some",
                              errors=[FieldError("owner", f"queued jobs limit {limit} reached")])
    return row if row.id is not None else None


S = TypeVar("S", bound=DataSource)


def _resolve_dataset(session: Session, spec: JobSpec, settings: Settings, user: Principal,
                     dataset_row: Row[Any] | None) -> tuple[JobSpec, str | None, str | None, str]:
    """The spec with its training (and evaluation) data resolved, the ids of the datasets used, and
    the training data's file. ``dataset_row``: the stored dataset ``spec.dataset.id`` names, read already."""
    if spec.dataset is None:
        raise InvalidInput.for_field("dataset", "a job needs a dataset (dataset.path or dataset.id)")
    ds, dataset_id, path = _resolve_source(session, spec.dataset, settings, user, "dataset", dataset_row)
    update: dict[str, Any] = {"dataset": ds}
    eval_id = None
    if spec.eval.dataset is not None:
        source, eval_id, _ = _resolve_source(session, spec.eval.dataset, settings, user, "eval.dataset")
        update["eval"] = spec.eval.model_copy(update={"dataset": source})
    return spec.model_copy(update=update), dataset_id, eval_id, path


_UNREAD = object()


def _resolve_source(session: Session, ds: S, settings: Settings, user: Principal, field: str,
                    row: Any = _UNREAD) -> tuple[S, str | None, str]:
    """A data source with its path confined to the dataset roots (or its id visible to the user) and
    its rows counted; the id of the stored dataset it names; its file. ``row``: the stored dataset
    ``ds.id`` names (None if there is none), where the caller read it already."""
    if ds.id is not None:
        if row is _UNREAD:
            row = session.connection().execute(_DATASET_FOR_JOB, {"dataset_id": ds.id}).first()
        if row is None or not may_use_dataset(user, row.owner_id, row.shared, settings):  # as if unknown
            raise InvalidInput.for_field(f"{field}.id", f"no dataset {ds.id}")
        return ds.model_copy(update={"num_rows": ds.num_rows or row.num_rows}), row.id, row.path
    assert ds.path is not None
    real = confine(ds.path, settings.dataset_roots, f"{field}.path")
    if not real.is_file():
        raise InvalidInput.for_field(f"{field}.path", f"{ds.path} is not a file")
    num_rows = ds.num_rows or _count_rows(real, ds.format.value, settings, ds.name, field)
    return ds.model_copy(update={"path": str(real), "num_rows": num_rows}), None, str(real)


def _count_rows(path: Path, declared: str, settings: Settings, name: str | None, field: str) -> int:
    from tunebox.datasets import DatasetError, inspect_dataset, resolve_source

    try:
        if name is not None:  # a dataset_info.json entry's file must lie under the roots too
            confine(str(resolve_source(path, declared, name).path), settings.dataset_roots, f"{field}.name")
        info = inspect_dataset(path, declared, max_rows=settings.max_dataset_rows, max_bytes=2**40, name=name)
    except DatasetError as exc:
        where = field if exc.field.startswith("dataset") else f"{field}.rows[{exc.row}].{exc.field}"
        raise InvalidInput(str(exc), errors=[FieldError(where, exc.message, row=exc.row)]) from exc
    return info.num_rows


def _with_report(session: Session, spec: JobSpec, path: str) -> JobSpec:
    """The spec against the stored report of this dataset file (``path``), tokenizer and
    ``seq_len`` (an inspection's, or a trainer's): a 422 with the counts where it drops more rows
    than the spec allows; else the spec with the dataset's token counts the spec leaves out (the
    tokens, and the rows packing makes) taken from it, which the plan's steps, duration and
    tokens/s are computed from."""
    from tunebox.data_keys import report_keys
    from tunebox.datasets import check_dropped_share

    ds = spec.dataset
    if ds is None or not spec.model.path:
        return spec
    keys = report_keys(Path(path), Path(spec.model.path))
    if keys is None:
        return spec
    report = find_report(session, *keys, spec.training.seq_len, ds.format.value, ds.name)
    if report is None:
        return spec
    why = check_dropped_share(report, ds.max_dropped_fraction,
                              "of the file, as last counted with this tokenizer")
    if why:
        raise InvalidInput.for_field("dataset.max_dropped_fraction", why)
    if ds.num_tokens is not None or ds.num_packed_rows is not None:
        return spec  # the spec's own counts stand
    counts = {"num_tokens": report.get("tokens") or None,
              "num_packed_rows": report.get("packed_rows") or None}
    return spec.model_copy(update={"dataset": ds.model_copy(update=counts)})


def _check_gpu_limit(user: Principal, settings: Settings, num_gpus: int) -> None:
    """A job needing more GPUs than its owner may hold at once could never start: refuse it now."""
    limit = user.max_gpus or settings.max_gpus_per_user
    if num_gpus > limit:
        raise InvalidInput(f"the job needs {num_gpus} GPUs; {user.name} may hold at most {limit} at once",
                           errors=[FieldError("resources.num_gpus", f"more than the limit of {limit} GPUs")])


def _box_nvme_folder(spec: JobSpec, settings: Settings) -> JobSpec:
    """A job's NVMe offload swaps to the folder of the box that runs it, whatever its what-if says."""
    if spec.hardware is None or spec.hardware.nvme_path is not None or settings.nvme_path is None:
        return spec
    hardware = spec.hardware.model_copy(update={"nvme_path": str(settings.nvme_path)})
    return spec.model_copy(update={"hardware": hardware})


def _check_nvme_paths(plan_json: dict[str, Any], spec: JobSpec, settings: Settings) -> None:
    """NVMe offload writes its swap files where the plan says: only under the box's ``nvme_path``."""
    zero = (plan_json.get("deepspeed_config") or {}).get("zero_optimization") or {}
    roots = [settings.nvme_path] if settings.nvme_path else []
    for target in ("offload_optimizer", "offload_param"):
        block = zero.get(target) or {}
        if block.get("device") != "nvme":
            continue
        if (spec.resources.deepspeed.get(target) or {}).get("nvme_path"):
            field = f"resources.deepspeed.{target}.nvme_path"
        elif spec.hardware is not None and spec.hardware.nvme_path:
            field = "hardware.nvme_path"
        else:
            field = f"resources.{target}"
        confine(str(block.get("nvme_path") or ""), roots, field)


def _gib(n: object) -> str:
    return f"{int(n) / GIB:.1f} GiB" if isinstance(n, int | float) else "? GiB"


def _refuse_unfit(plan: Plan) -> None:
    """A job the plan says does not fit: the sizes in GiB and the fixes that fit, as the plan has them."""
    body = plan.model_dump(mode="json")
    per_gpu, host = body["per_gpu"], body["host"]
    alternatives = body.get("alternatives", [])
    over = []
    if body["margin_bytes"] < 0:
        over.append(FieldError("resources", f"needs {_gib(per_gpu['required_bytes'])} per GPU, "
                               f"{_gib(per_gpu['required_bytes'] + body['margin_bytes'])} usable"))
    if not host["fits"]:
        over.append(FieldError("resources.offload_optimizer", f"needs {_gib(host['total_bytes'])} of host "
                               f"RAM of {_gib(host['capacity_bytes'])}"))
    if not body["nvme"]["fits"]:
        over.append(FieldError("resources.offload_param", f"needs {_gib(body['nvme']['total_bytes'])} of "
                               f"NVMe of {_gib(body['nvme']['capacity_bytes'])}"))
    if not over:
        over.append(FieldError("resources", "the planned memory exceeds the box"))
    fixes = "; ".join(f"{a['changes']} ({a['reason']})" for a in alternatives[:3])
    detail = ("the job does not fit: " + "; ".join(e["message"] for e in over)
              + (f". What fits: {fixes}" if fixes else ". No configuration of this box fits it"))
    raise PlanDoesNotFit(detail, errors=over, plan=body, alternatives=alternatives)


def _refuse_beyond_context(plan: Plan) -> None:
    """A job past its model's trained context is refused for that, before its memory is judged."""
    for note in plan.warnings:
        if note.code == "seq_len_beyond_context":
            raise refusal(note.code, note.field or "training.seq_len", note.message)


def leased_gpu_bytes(plan_json: dict[str, Any], spec: JobSpec) -> int:
    """What the job's lease holds on each of its cards: the training's peak, and the evaluation's
    where the job evaluates. An evaluation after training runs alone on the first card, so the
    lease covers the larger of the two; one of a checkpoint taken during training
    (``eval.when: steps``) runs beside the training where the plan says both fit, so the lease
    covers their sum (otherwise it waits for the training to end). An evaluation that fits no GPU
    (the plan warns ``eval_memory``) fails on its own and is not held."""
    training = int(plan_json["per_gpu"]["required_bytes"])
    evaluation = plan_json["eval"]
    if spec.eval.when.value == "none" or not evaluation["fits"]:
        return training
    if spec.eval.when.value == "steps" and evaluation["fits_beside_training"]:
        return training + int(evaluation["total_bytes"])
    return max(training, int(evaluation["total_bytes"]))


@dataclass(frozen=True)
class CreatedJob:
    """A job just stored: its id and priority (to send its task with) and its 201 body."""

    id: str
    priority: int
    body: bytes


def create_job(session: Session, settings: Settings, user: Principal, spec: JobSpec,
               watch: WorkerWatch) -> tuple[CreatedJob, str]:
    """Validate, plan and store a queued job with its 'created' and audit events (and a 'waiting'
    one while no worker reports; ``watch``, the app's, remembers a live one between submissions).

    Returns the job (its body is ``JobRead``'s JSON of the stored row, what ``GET`` answers) and the
    Celery task id stored with it (to send under after the commit). The spec and the plan are
    written to JSON once (pydantic's serialiser, several times faster than ``json.dumps`` on these
    documents), for the row and for the body.
    """
    check_storable(spec)
    spec = absorb_deepspeed_config(spec)
    dataset_row = _check_queue_limit(session, user, settings, spec.dataset.id if spec.dataset else None)
    spec = resolve_model(spec, settings, required=True)
    spec, dataset_id, eval_dataset_id, data_file = _resolve_dataset(session, spec, settings, user,
                                                                    dataset_row)
    spec = _with_report(session, spec, data_file)
    spec = _box_nvme_folder(spec, settings)
    plan = make_plan(spec, hardware_for(spec, session, settings))
    _refuse_beyond_context(plan)
    if not plan.fits:
        _refuse_unfit(plan)
    _check_gpu_limit(user, settings, plan.num_gpus)
    plan_json = plan.model_dump(mode="json")
    _check_nvme_paths(plan_json, spec, settings)
    task_id = new_task_id()
    job_id = new_id("job")
    created = [
        {"kind": "created", "actor": user.name, "message": "job created",
         "data": {"status": "queued", "num_gpus": plan.num_gpus}},
        {"kind": "audit", "actor": user.name, "message": "create", "data": {"action": "create"}},
    ]
    if (silent := watch.no_worker(session, settings)) is not None:
        created.append({"kind": "waiting", "actor": "api", "message": silent,
                        "data": {"reason": "no_worker"}})
    stored = jobs.create(session, {
        "id": job_id, "owner_id": user.user_id, "name": spec.name, "model": model_label(spec),
        "status": JobStatus.QUEUED, "priority": spec.priority,
        "spec": to_json(spec.model_dump(mode="json")).decode(), "plan": to_json(plan_json).decode(),
        "dataset_id": dataset_id, "eval_dataset_id": eval_dataset_id,
        "num_gpus": plan.num_gpus, "celery_task_id": task_id,
        "planned_peak_gpu_bytes": leased_gpu_bytes(plan_json, spec),
        "planned_host_bytes": plan_json["host"]["total_bytes"]}, created)
    body = job_read_json(SimpleNamespace(**stored), user.name)
    return CreatedJob(id=job_id, priority=spec.priority, body=body), task_id


def new_task_id() -> str:
    """The id of a run task, stored with the job before the task is sent under it."""
    return str(uuid.uuid4())


def dispatch(enqueue: Enqueue, job_id: str, priority: int, task_id: str) -> None:
    """Send the run task after the commit, under the task id stored with the job.

    A failed send leaves the job queued: the database is the truth, and the workers' reconciler
    sends a queued job that has no message again.
    """
    try:
        enqueue(job_id, priority=priority, task_id=task_id)
    except Exception:
        log.exception("could not enqueue %s; it stays queued for the reconciler", job_id)


# --------------------------------------------------------------------------- changing


def _audit(session: Session, job_id: str, user: Principal, action: str, **data: Any) -> None:
    session.add(JobEvent(job_id=job_id, kind="audit", actor=user.name, message=action,
                         data={"action": action, **data}))


def cancel_job(session: Session, user: Principal, job_id: str) -> tuple[JobRead, bool]:
    """Queued or paused → cancelled at once; starting/running/evaluating/pausing → cancelling (the
    worker ends it).

    Returns the job and whether it is already cancelled. Retries when a worker moved the job between
    the read and the guarded update (a cancel racing a start).
    """
    job, owner = load_job(session, job_id)
    if job.owner_id != user.user_id and not user.is_admin:
        raise Forbidden(f"only {owner} or an admin may cancel {job_id}")
    for _ in range(5):
        status = JobStatus(job.status)
        if status.terminal():
            raise Conflict(f"{job_id} is already {status.value}",
                           errors=[FieldError("status", f"job is {status.value}")], job_status=status.value)
        if status is JobStatus.CANCELLING:
            return job_read(job, owner), False
        idle = status in (JobStatus.QUEUED, JobStatus.PAUSED)  # no process to stop
        target = JobStatus.CANCELLED if idle else JobStatus.CANCELLING
        try:
            transition(session, job_id, target, expected=status, actor=user.name,
                       message=f"cancel requested by {user.name}", cancel_requested_at=utcnow())
        except IllegalTransition:
            session.refresh(job)
            continue
        _audit(session, job_id, user, "cancel", previous=status.value)
        session.flush()
        session.refresh(job)
        return job_read(job, owner), target is JobStatus.CANCELLED
    raise Conflict(f"{job_id} keeps changing state; try again")


def pause_job(session: Session, user: Principal, job_id: str) -> JobRead:
    """Running → pausing: the training checkpoints at its next step boundary and ends, and the worker
    frees its GPUs (→ paused). Pausing or paused again changes nothing; a job that is not training
    (queued, starting, evaluating) has nothing to pause."""
    job, owner = _own_job(session, user, job_id, "pause")
    status = JobStatus(job.status)
    if status in (JobStatus.PAUSING, JobStatus.PAUSED):
        return job_read(job, owner)
    if status is not JobStatus.RUNNING:
        raise Conflict(f"{job_id} is {status.value}: only a running job can be paused",
                       errors=[FieldError("status", f"job is {status.value}")], job_status=status.value)
    try:
        transition(session, job_id, JobStatus.PAUSING, expected=status, actor=user.name,
                   message=f"pause requested by {user.name}")
    except IllegalTransition as exc:
        raise Conflict(f"{job_id} changed state meanwhile; try again") from exc
    _audit(session, job_id, user, "pause", previous=status.value)
    session.flush()
    session.refresh(job)
    return job_read(job, owner)


def resume_job(session: Session, user: Principal, job_id: str) -> JobRead:
    """Paused → queued: the next run continues from the newest checkpoint (same step, same data order).
    The caller sends the run task after the commit."""
    job, owner = _own_job(session, user, job_id, "resume")
    status = JobStatus(job.status)
    if status is not JobStatus.PAUSED:
        raise Conflict(f"{job_id} is {status.value}: only a paused job can be resumed",
                       errors=[FieldError("status", f"job is {status.value}")], job_status=status.value)
    try:
        transition(session, job_id, JobStatus.QUEUED, expected=status, actor=user.name,
                   message=f"resumed by {user.name}", dispatch_checked_at=utcnow())
    except IllegalTransition as exc:
        raise Conflict(f"{job_id} changed state meanwhile; try again") from exc
    _audit(session, job_id, user, "resume")
    session.flush()
    session.refresh(job)
    return job_read(job, owner)


def _own_job(session: Session, user: Principal, job_id: str, action: str) -> tuple[Job, str]:
    """The job, if ``user`` may change it (its owner or an admin), as cancelling does."""
    job, owner = load_job(session, job_id)
    if job.owner_id != user.user_id and not user.is_admin:
        raise Forbidden(f"only {owner} or an admin may {action} {job_id}")
    return job, owner


def set_priority(session: Session, user: Principal, job_id: str, priority: int) -> JobRead:
    job, owner = load_job(session, job_id)
    if JobStatus(job.status).terminal():
        raise Conflict(f"{job_id} is already {job.status.value}",
                       errors=[FieldError("status", f"job is {job.status.value}")])
    previous = job.priority
    job.priority = priority
    job.updated_at = utcnow()
    _audit(session, job_id, user, "priority", previous=previous, priority=priority)
    session.flush()
    return job_read(job, owner)


# --------------------------------------------------------------------------- events, metrics, checkpoints


def event_read(ev: JobEvent) -> EventRead:
    return EventRead(id=ev.id, job_id=ev.job_id, kind=ev.kind, actor=ev.actor, message=ev.message,
                     data=ev.data, created_at=ev.created_at)


def events_after(session: Session, job_id: str, after: int, limit: int) -> list[EventRead]:
    return [event_read(ev) for ev in events.after(session, job_id, after, limit)]


def list_events(session: Session, job_id: str, after: int, limit: int) -> EventList:
    items = events_after(session, job_id, after, limit)
    return EventList(items=items, next_after=items[-1].id if items else after or None)


def job_status(session: Session, job_id: str) -> JobStatus | None:
    return jobs.status_of(session, job_id)


_PROGRESS_COLUMNS: tuple[Any, ...] = (
    Job.status, Job.step, Job.total_steps, Job.epoch, Job.loss, Job.learning_rate, Job.tokens_per_second,
    Job.samples_per_second, Job.eta_seconds, Job.measured_peak_gpu_bytes, Job.measured_host_rss_bytes,
    Job.host_cpu_percent, Job.progress_at)


def job_status_and_progress(session: Session, job_id: str) -> tuple[JobStatus | None, Progress | None]:
    """The job's state and its latest progress (None before the first step is recorded)."""
    row = session.execute(select(*_PROGRESS_COLUMNS).where(Job.id == job_id)).first()
    if row is None:
        return None, None
    return JobStatus(row.status), _progress(row) if row.progress_at is not None else None


def metric_series(session: Session, job_id: str, kind: MetricKind, after_step: int | None,
                  limit: int) -> MetricSeries:
    points = [MetricPointRead(step=p.step, epoch=p.epoch, loss=p.loss, learning_rate=p.learning_rate,
                              tokens_per_second=p.tokens_per_second, samples_per_second=p.samples_per_second,
                              gpu_memory_bytes=p.gpu_memory_bytes, host_rss_bytes=p.host_rss_bytes,
                              host_cpu_percent=p.host_cpu_percent, created_at=p.created_at)
              for p in metrics.points(session, job_id, kind, after_step=after_step, limit=limit)]
    return MetricSeries(job_id=job_id, kind=kind, points=points)


def list_checkpoints(session: Session, job_id: str) -> CheckpointList:
    rows = checkpoints.of_job(session, job_id)
    return CheckpointList(items=[CheckpointRead(id=c.id, step=c.step, path=c.path, size_bytes=c.size_bytes,
                                                is_final=c.is_final, eval_status=c.eval_status,
                                                eval_result=c.eval_result, created_at=c.created_at)
                                 for c in rows])
