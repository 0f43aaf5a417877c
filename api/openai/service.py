"""OpenAI's fine-tuning objects from tunebox's jobs, and OpenAI's create request as a tunebox job spec."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Sequence
from pathlib import PurePath
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete
from sqlalchemy.orm import Session

from api.auth.access import may_read, sees_everything
from api.auth.service import Principal
from api.errors import InvalidInput, validation_field_errors
from api.jobs import idempotency
from api.openai.errors import OpenAIError
from api.openai.schemas import FILE_FORMAT, FineTuningJobCreate
from planner.spec import JobSpec, TrainingSpec
from store import checkpoints, events, jobs, metrics
from store.models import IdempotencyKey, Job, JobEvent, MetricPoint
from store.states import JobStatus
from tunebox.settings import Settings

#: tunebox's states as the SDK's ``FineTuningJob.status`` names them (``tunebox.status`` has the exact one)
STATUS = {
    JobStatus.QUEUED: "queued",
    JobStatus.STARTING: "running",
    JobStatus.RUNNING: "running",
    JobStatus.EVALUATING: "running",
    JobStatus.PAUSING: "running",
    JobStatus.PAUSED: "paused",
    JobStatus.CANCELLING: "cancelled",
    JobStatus.CANCELLED: "cancelled",
    JobStatus.SUCCEEDED: "succeeded",
    JobStatus.FAILED: "failed",
}
RESULTS_PREFIX = "results_"
RESULTS_COLUMNS = ("step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy")
#: job events that are bookkeeping, not news for the job's owner
_QUIET_EVENTS = {"log", "audit"}
_DEFAULT_LR = TrainingSpec().learning_rate


# --------------------------------------------------------------------------- the create request


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def spec_from_request(body: FineTuningJobCreate) -> JobSpec:
    """The job spec of an OpenAI create request; ``tunebox`` fields are merged over the OpenAI ones."""
    if body.integrations:
        raise OpenAIError(400, "integrations are not supported", param="integrations")
    hyper = body.hyper()
    training: dict[str, Any] = {}
    if isinstance(hyper.n_epochs, int):
        training.update(epochs=hyper.n_epochs, max_steps=None)
    if isinstance(hyper.learning_rate_multiplier, float | int):
        training["learning_rate"] = _DEFAULT_LR * hyper.learning_rate_multiplier
    if isinstance(hyper.batch_size, int):  # examples per optimizer step, as OpenAI counts them
        training.update(micro_batch_size=hyper.batch_size, gradient_accumulation_steps=1)
    if body.seed is not None:
        training["seed"] = body.seed
    spec: dict[str, Any] = {
        "name": body.suffix or f"ft-{PurePath(body.model).name}"[:200],
        "model": {"path": body.model},
        "dataset": {"id": body.training_file, "format": FILE_FORMAT},
        "training": training,
    }
    if body.validation_file is not None:  # evaluated on all of it; every training row trains
        spec["eval"] = {"dataset": {"id": body.validation_file, "format": FILE_FORMAT}}
    if body.tunebox:
        spec = _merge(spec, body.tunebox)
    try:
        return JobSpec.model_validate(spec)
    except ValidationError as exc:
        fields = validation_field_errors(exc.errors())
        raise InvalidInput(
            "; ".join(f"{f['field']}: {f['message']}" for f in fields[:5]), errors=fields
        ) from exc


def retry_key(
    session: Session, user: Principal, explicit: str | None, body_hash: str, retries_taken: int
) -> str:
    """The idempotency key of a create: the caller's, or one made from the body.

    The SDK sends no key but counts its attempts (``X-Stainless-Retry-Count``): a retry of a body is
    the same job (its first attempt may have been created already), a first attempt is a new one.
    """
    if explicit is not None:
        return explicit
    key = f"openai-create:{body_hash}"
    if retries_taken == 0:
        session.execute(
            delete(IdempotencyKey).where(
                IdempotencyKey.user_id == user.user_id,
                IdempotencyKey.key == key,
                IdempotencyKey.state == "done",
            )
        )
        session.commit()
    return key


def fingerprint(body: FineTuningJobCreate) -> str:
    return idempotency.fingerprint(body.model_dump(mode="json", exclude_unset=True))


# --------------------------------------------------------------------------- objects


def _ts(value: Any) -> int | None:
    return int(value.timestamp()) if value is not None else None


def _model_name(job: Job) -> str:
    asked = (job.openai_request or {}).get("model")
    return str(asked or PurePath(str((job.spec.get("model") or {}).get("path") or "model")).name)


def fine_tuned_model(job: Job) -> str:
    """The name ``tunebox export`` resolves: ``ft:<model>[:<suffix>]:<job id>``."""
    suffix = (job.openai_request or {}).get("suffix")
    return ":".join(["ft", _model_name(job), *([suffix] if suffix else []), job.id])


def _hyperparameters(job: Job) -> dict[str, Any]:
    training = job.spec.get("training") or {}
    resolved = (job.plan or {}).get("resolved") or {}
    epochs = training.get("epochs")
    return {
        "n_epochs": int(epochs) if isinstance(epochs, int | float) and epochs == int(epochs) else "auto",
        "batch_size": resolved.get("global_batch_size", "auto"),
        "learning_rate_multiplier": float(training.get("learning_rate", _DEFAULT_LR)) / _DEFAULT_LR,
    }


def _tunebox_fields(job: Job, owner: str) -> dict[str, Any]:
    plan = job.plan or {}
    resolved = plan.get("resolved") or {}
    keys = (
        "num_gpus",
        "zero_stage",
        "offload_optimizer",
        "offload_param",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "seq_len",
        "method",
    )
    return {
        "status": job.status.value,
        "owner": owner,
        "name": job.name,
        "dataset_id": job.dataset_id,
        "plan": {
            **{k: resolved.get(k) for k in keys},
            "fits": plan.get("fits"),
            "per_gpu_required_bytes": (plan.get("per_gpu") or {}).get("required_bytes"),
            "estimated_duration_seconds": plan.get("estimated_duration_seconds"),
        },
        "gpu_indices": job.gpu_indices,
        "worker_host": job.worker_host,
        "step": job.step,
        "total_steps": job.total_steps,
        "loss": job.loss,
        "failure_kind": job.failure_kind,
    }


def job_object(job: Job, owner: str) -> dict[str, Any]:
    """``fine_tuning.job`` as the SDK's ``FineTuningJob`` defines it, plus ``tunebox`` figures."""
    asked = job.openai_request or {}
    status = JobStatus(job.status)
    hyper = _hyperparameters(job)
    resolved = (job.plan or {}).get("resolved") or {}
    error = None
    if status is JobStatus.FAILED:
        error = {
            "code": job.failure_reason or "error",
            "message": job.failure_message or "the job failed",
            "param": None,
        }
    trained = None
    if status is JobStatus.SUCCEEDED and job.step:
        # rows are packed to seq_len: a step trains global_batch_size x seq_len tokens
        rows = int(resolved.get("global_batch_size") or 0)
        trained = int(job.step) * rows * int(resolved.get("seq_len") or 0)
    finish = None
    if status is JobStatus.RUNNING and job.eta_seconds is not None:
        finish = int(time.time() + job.eta_seconds)
    return {
        "id": job.id,
        "object": "fine_tuning.job",
        "created_at": _ts(job.created_at),
        "error": error,
        "fine_tuned_model": fine_tuned_model(job) if status is JobStatus.SUCCEEDED else None,
        "finished_at": _ts(job.finished_at),
        "hyperparameters": hyper,
        "model": _model_name(job),
        "organization_id": f"org-{owner}",
        "result_files": [RESULTS_PREFIX + job.id] if job.step else [],
        "seed": int((job.spec.get("training") or {}).get("seed", 0)),
        "status": STATUS[status],
        "trained_tokens": trained,
        "training_file": asked.get("training_file") or job.dataset_id or "",
        "validation_file": asked.get("validation_file") or job.eval_dataset_id,
        "estimated_finish": finish,
        "integrations": [],
        "metadata": asked.get("metadata"),
        "user_provided_suffix": asked.get("suffix"),
        "method": {"type": "supervised", "supervised": {"hyperparameters": hyper}},
        "tunebox": _tunebox_fields(job, owner),
    }


def page(data: Sequence[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's list envelope over ``data`` (newest first), from the item after ``after``."""
    items = list(data)
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    shown = items[:limit]
    return {
        "object": "list",
        "data": shown,
        "has_more": len(items) > limit,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
    }


# --------------------------------------------------------------------------- reading


def readable_job(session: Session, settings: Settings, user: Principal, job_id: str) -> tuple[Job, str]:
    row = jobs.with_owner(session, job_id)
    if row is None or not may_read(user, row[0].owner_id, settings):
        raise OpenAIError(
            404,
            f"No such fine-tuning job: {job_id}",
            param="fine_tuning_job_id",
            code="fine_tuning_job_not_found",
        )
    return row[0], row[1]


def list_jobs(
    session: Session, settings: Settings, user: Principal, after: str | None, limit: int
) -> dict[str, Any]:
    rows = jobs.newest_first(session, limit + 1, after=after, summary=False,
                             owner_id=None if sees_everything(user, settings) else user.user_id)
    data = [job_object(job, owner) for job, owner in rows[:limit]]
    return {
        "object": "list",
        "data": data,
        "has_more": len(rows) > limit,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def _level(event: JobEvent) -> str:
    data = event.data or {}
    if event.kind == "status" and data.get("to") == JobStatus.FAILED.value:
        return "error"
    if event.kind == "eval" and data.get("status") == "failed":
        return "warn"
    return "info"


def _metrics_event(point: MetricPoint, total: int | None, valid: dict[int, float | None]) -> dict[str, Any]:
    data = {
        "step": point.step,
        "train_loss": point.loss,
        "train_mean_token_accuracy": None,
        "valid_loss": valid.get(point.step),
        "valid_mean_token_accuracy": None,
        "total_steps": total,
        "learning_rate": point.learning_rate,
        "tokens_per_second": point.tokens_per_second,
    }
    loss = f"{point.loss:.4f}" if point.loss is not None else "n/a"
    return {
        "id": f"ftevent-m{point.id}",
        "object": "fine_tuning.job.event",
        "created_at": _ts(point.created_at),
        "level": "info",
        "message": f"Step {point.step}/{total or '?'}: training loss={loss}",
        "data": data,
        "type": "metrics",
        "_order": point.created_at,
    }


def list_events(session: Session, job: Job, after: str | None, limit: int) -> dict[str, Any]:
    """The job's events and its per-step metrics as ``fine_tuning.job.event``, newest first."""
    items: list[dict[str, Any]] = [
        {
            "id": f"ftevent-e{ev.id}",
            "object": "fine_tuning.job.event",
            "created_at": _ts(ev.created_at),
            "level": _level(ev),
            "message": ev.message,
            "data": {"kind": ev.kind, **(ev.data or {})},
            "type": "message",
            "_order": ev.created_at,
        }
        for ev in events.excluding_kinds(session, job.id, _QUIET_EVENTS)
    ]
    points = metrics.points(session, job.id)
    valid = {p.step: p.loss for p in points if p.kind == "eval"}
    items += [_metrics_event(p, job.total_steps, valid) for p in points if p.kind == "train"]
    items.sort(key=lambda item: (item.pop("_order"), item["id"]), reverse=True)
    return page(items, after, limit)


def list_checkpoints(session: Session, job: Job, after: str | None, limit: int) -> dict[str, Any]:
    losses = {p.step: p.loss for p in metrics.points(session, job.id, "train")}
    rows = checkpoints.of_job(session, job.id, newest_first=True)
    data = [
        {
            "id": c.id,
            "object": "fine_tuning.job.checkpoint",
            "created_at": _ts(c.created_at),
            "fine_tuned_model_checkpoint": f"{fine_tuned_model(job)}:ckpt-step-{c.step}",
            "fine_tuning_job_id": job.id,
            "step_number": c.step,
            "metrics": {
                "step": c.step,
                "train_loss": losses.get(c.step),
                "valid_loss": (c.eval_result or {}).get("eval_loss"),
                "train_mean_token_accuracy": None,
                "valid_mean_token_accuracy": None,
                "full_valid_loss": None,
                "full_valid_mean_token_accuracy": None,
            },
            "tunebox": {"is_final": c.is_final, "size_bytes": c.size_bytes, "eval_status": c.eval_status},
        }
        for c in rows
    ]
    return page(data, after, limit)


def results_csv(session: Session, job: Job) -> str:
    """The job's ``result_files`` entry: its per-step metrics as CSV."""
    points = metrics.points(session, job.id)
    valid = {p.step: p.loss for p in points if p.kind == "eval"}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(RESULTS_COLUMNS)
    for p in points:
        if p.kind == "train":
            writer.writerow(
                [
                    p.step,
                    "" if p.loss is None else p.loss,
                    "",
                    "" if valid.get(p.step) is None else valid[p.step],
                    "",
                ]
            )
    return out.getvalue()
