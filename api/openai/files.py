"""``/v1/files``: a file of purpose ``fine-tune`` is a tunebox dataset (one store, one owner)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from api.auth.access import may_use_dataset
from api.auth.service import Principal
from api.datasets import service as datasets
from api.datasets.schemas import DatasetRead
from api.deps import CurrentUser, SessionDep, SettingsDep, after_commit
from api.errors import InvalidInput
from api.openai import service
from api.openai.errors import OpenAIError, OpenAIRoute
from api.openai.schemas import FILE_FORMAT
from store import jobs
from store.ids import new_id
from store.models import Dataset, Job
from tunebox.settings import Settings

router = APIRouter(prefix="/v1/files", tags=["openai"], route_class=OpenAIRoute)

PURPOSE = "fine-tune"
_CHUNK = 1 << 16


def file_object(ds: DatasetRead | Dataset) -> dict[str, Any]:
    return {
        "id": ds.id,
        "object": "file",
        "bytes": ds.size_bytes,
        "created_at": int(ds.created_at.timestamp()),
        "filename": ds.name,
        "purpose": PURPOSE,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def _not_found(file_id: str) -> OpenAIError:
    return OpenAIError(404, f"No such File object: {file_id}", param="id", code="file_not_found")


def owned_dataset(session: Session, settings: Settings, user: Principal, file_id: str) -> Dataset:
    """The dataset behind ``file_id``, or 404 when unknown or not the caller's to read."""
    row = session.get(Dataset, file_id)
    if row is None or not may_use_dataset(user, row.owner_id, row.shared, settings):
        raise _not_found(file_id)
    return row


async def _spool_form(request: Request, spool: datasets.Spool) -> str | None:
    """Copy the ``file`` part into the spool; return its file name."""
    async with request.form(max_files=1, max_fields=8) as form:
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise OpenAIError(400, "a multipart upload needs a `file` part", param="file")
        if purpose != PURPOSE:
            raise OpenAIError(
                400,
                f"purpose must be '{PURPOSE}' (got {purpose!r}): tunebox stores fine-tuning data only",
                param="purpose",
            )
        while chunk := await upload.read(_CHUNK):
            spool.write(chunk)
        return upload.filename


@router.post("", summary="Upload a fine-tuning file (OpenAI chat JSONL)")
async def create_file(
    request: Request, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> dict[str, Any]:
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise OpenAIError(
            400, "upload the file as multipart/form-data with `file` and `purpose`", param="file"
        )
    dataset_id = new_id("ds")
    spool = await run_in_threadpool(datasets.open_spool, settings, dataset_id)
    try:
        filename = await _spool_form(request, spool)
    except BaseException:
        spool.discard()
        raise
    spool.close()
    name = datasets.safe_name(filename, dataset_id)
    try:
        created, _ = await run_in_threadpool(
            datasets.register, session, settings, user, dataset_id, spool, name, FILE_FORMAT
        )
    except InvalidInput as exc:  # the dataset checks: the message names the row and the key
        raise OpenAIError(400, exc.detail, param="file", code="invalid_file") from exc
    return file_object(created)


@router.get("", summary="Your files, newest first")
def list_files(
    session: SessionDep,
    settings: SettingsDep,
    user: CurrentUser,
    purpose: Annotated[str | None, Query(max_length=64)] = None,
    after: Annotated[str | None, Query(pattern=r"^ds_[0-9a-z]{1,40}$")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
) -> dict[str, Any]:
    if purpose not in (None, PURPOSE):
        return {"object": "list", "data": [], "has_more": False, "first_id": None, "last_id": None}
    page = datasets.list_datasets(session, settings, user, after, min(limit, 200))
    data = [file_object(ds) for ds in page.items]
    if order == "asc":
        data.reverse()
    return {
        "object": "list",
        "data": data,
        "has_more": page.next_after is not None,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def _results_job(session: Session, settings: Settings, user: Principal, file_id: str) -> Job:
    try:
        job, _ = service.readable_job(session, settings, user, file_id.removeprefix(service.RESULTS_PREFIX))
    except OpenAIError:
        raise _not_found(file_id) from None
    return job


@router.get("/{file_id}", summary="One file")
def retrieve_file(
    file_id: str, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> dict[str, Any]:
    if file_id.startswith(service.RESULTS_PREFIX):
        job = _results_job(session, settings, user, file_id)
        size = len(service.results_csv(session, job).encode())
        return {
            "id": file_id,
            "object": "file",
            "bytes": size,
            "created_at": int(job.created_at.timestamp()),
            "filename": f"{job.id}-results.csv",
            "purpose": "fine-tune-results",
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
    return file_object(owned_dataset(session, settings, user, file_id))


@router.get("/{file_id}/content", summary="The file's content (JSON Lines; a job's results as CSV)")
def file_content(file_id: str, session: SessionDep, settings: SettingsDep, user: CurrentUser) -> Response:
    if file_id.startswith(service.RESULTS_PREFIX):
        job = _results_job(session, settings, user, file_id)
        return Response(service.results_csv(session, job), media_type="text/csv")
    row = owned_dataset(session, settings, user, file_id)
    if not Path(row.path).is_file():
        raise _not_found(file_id)
    return FileResponse(row.path, media_type="application/jsonl", filename=row.name)


@router.delete("/{file_id}", summary="Delete a file (the owner or an admin)")
def delete_file(
    file_id: str, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> dict[str, Any]:
    row = owned_dataset(session, settings, user, file_id)
    if row.owner_id != user.user_id and not user.is_admin:
        raise OpenAIError(403, f"only the owner of {file_id} or an admin may delete it", param="id")
    used = jobs.using_dataset(session, file_id)
    if used is not None:
        role = "training" if used[1] else "validation"
        raise OpenAIError(
            400,
            f"{file_id} is the {role} file of {used[0]}; a job's data is kept with it",
            param="id",
            code="file_in_use",
        )
    path = Path(row.path)
    session.delete(row)
    session.flush()
    after_commit(session, lambda: path.unlink(missing_ok=True))
    return {"id": file_id, "object": "file", "deleted": True}
