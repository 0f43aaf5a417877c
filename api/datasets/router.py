"""``/v1/datasets``: upload (raw JSON/JSONL body or multipart ``file``), list, show."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from api.datasets import service
from api.datasets.schemas import DatasetCreated, DatasetList, DatasetRead, DatasetUpdate
from api.deps import CurrentUser, SessionDep, SettingsDep
from api.errors import FieldError, InvalidInput
from store.ids import new_id

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])

_CHUNK = 1 << 16


async def _spool_raw(request: Request, spool: service.Spool) -> None:
    async for chunk in request.stream():
        spool.write(chunk)


async def _spool_multipart(request: Request, spool: service.Spool) -> tuple[str | None, str | None]:
    """Copy the ``file`` part into the spool; return the form's ``name`` and ``format`` if given."""
    async with request.form(max_files=1, max_fields=8) as form:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidInput("a multipart upload needs a `file` part",
                               errors=[FieldError("file", "missing")])
        while chunk := await upload.read(_CHUNK):
            spool.write(chunk)
        name, fmt = form.get("name"), form.get("format")
        return (name if isinstance(name, str) else upload.filename,
                fmt if isinstance(fmt, str) else None)


@router.post("", status_code=201, summary="Upload a dataset (JSON array or JSON Lines)",
             description="The same bytes uploaded again by their owner answer 200 with the dataset "
                         "made the first time.",
             openapi_extra={"requestBody": {"content": {
                 "application/json": {}, "application/x-ndjson": {}, "multipart/form-data": {}}}})
async def upload_dataset(
    request: Request, response: Response, session: SessionDep, settings: SettingsDep, user: CurrentUser,
    name: Annotated[str | None, Query(max_length=200)] = None,
    format: Annotated[str, Query(description="auto | alpaca | sharegpt | openai | text")] = "auto",  # noqa: A002
    shared: Annotated[bool, Query(description="Share it with every user")] = False,
) -> DatasetCreated:
    declared = service.check_format(format)
    dataset_id = new_id("ds")
    spool = await run_in_threadpool(service.open_spool, settings, dataset_id)
    try:
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form_name, form_format = await _spool_multipart(request, spool)
            name = name or form_name
            declared = service.check_format(form_format) if form_format else declared
        else:
            await _spool_raw(request, spool)
    except BaseException:
        spool.discard()
        raise
    spool.close()
    final_name = service.safe_name(name, dataset_id)
    created, new = await run_in_threadpool(service.register, session, settings, user, dataset_id, spool,
                                           final_name, declared, shared)
    if not new:
        response.status_code = 200
    return created


@router.get("", summary="Your datasets (everyone's for an admin), newest first")
def list_datasets(
    session: SessionDep, settings: SettingsDep, user: CurrentUser,
    after: Annotated[str | None, Query(pattern=r"^ds_[0-9a-z]{1,40}$")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> DatasetList:
    return service.list_datasets(session, settings, user, after, limit)


@router.get("/{dataset_id}", summary="One dataset", responses={404: {"description": "Unknown, or not yours"}})
def get_dataset(dataset_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")], session: SessionDep,
                settings: SettingsDep, user: CurrentUser) -> DatasetRead:
    return service.get_dataset(session, settings, user, dataset_id)


@router.patch("/{dataset_id}", summary="Share, unshare or rename a dataset (its owner or an admin)",
              responses={403: {"description": "Shared with you, not yours"},
                         404: {"description": "Unknown, or not yours"}})
def update_dataset(dataset_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")], change: DatasetUpdate,
                   session: SessionDep, settings: SettingsDep, user: CurrentUser) -> DatasetRead:
    return service.update_dataset(session, settings, user, dataset_id, change)
