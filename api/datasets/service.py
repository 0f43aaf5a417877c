"""Storing an uploaded dataset: spool to disk while hashing, validate with tunebox.datasets, register.

The stored file is always JSON Lines (a JSON array upload is rewritten one record a line), so
``<id>.jsonl`` says what it holds.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from api.auth.access import may_use_dataset, sees_everything
from api.auth.service import Principal
from api.datasets.schemas import DatasetCreated, DatasetList, DatasetRead, DatasetUpdate
from api.errors import FieldError, Forbidden, InvalidInput, NotFound
from store.models import Dataset, User
from tunebox.datasets import FORMATS as DATASET_FORMATS
from tunebox.datasets import SAMPLE_ROWS, DatasetError, inspect_dataset, iter_records
from tunebox.settings import Settings

FORMATS = ("auto", *DATASET_FORMATS)


@dataclass
class Spool:
    """An upload being written to a temporary file, hashed as it goes."""

    path: Path
    handle: IO[bytes]
    sha: hashlib._Hash
    size: int = 0

    def write(self, chunk: bytes) -> None:
        self.handle.write(chunk)
        self.sha.update(chunk)
        self.size += len(chunk)

    def close(self) -> None:
        self.handle.close()

    def discard(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def datasets_dir(settings: Settings) -> Path:
    path = settings.data_dir / "datasets"
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_spool(settings: Settings, dataset_id: str) -> Spool:
    path = datasets_dir(settings) / f".upload-{dataset_id}"
    return Spool(path=path, handle=path.open("wb"), sha=hashlib.sha256())


def check_format(declared: str) -> str:
    if declared not in FORMATS:
        raise InvalidInput.for_field("format", f"must be one of {', '.join(FORMATS)}")
    return declared


def _dataset_error(exc: DatasetError) -> InvalidInput:
    field = exc.field if exc.field.startswith("dataset") else f"dataset.rows[{exc.row}].{exc.field}"
    extra = {"row": exc.row} if exc.row is not None else {}
    return InvalidInput(str(exc), errors=[FieldError(field, exc.message, **extra)])


def _to_jsonl(src: Path, dest: Path) -> None:
    with dest.open("w", encoding="utf-8") as out:
        for record in iter_records(src):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def _existing(session: Session, user: Principal, sha256: str) -> Dataset | None:
    """The caller's dataset with these exact bytes, if they uploaded them before."""
    return session.scalars(select(Dataset).where(Dataset.owner_id == user.user_id, Dataset.sha256 == sha256)
                           .order_by(Dataset.id).limit(1)).first()


def _sample(path: Path) -> list[dict[str, Any]]:
    return list(itertools.islice(iter_records(path), SAMPLE_ROWS))


def register(session: Session, settings: Settings, user: Principal, dataset_id: str, spool: Spool,
             name: str, declared: str, shared: bool = False) -> tuple[DatasetCreated, bool]:
    """Validate the spooled upload and store it as ``<id>.jsonl`` with its row; the spool is consumed.

    Returns the dataset and whether it is new: the same bytes uploaded again by their owner give the
    dataset they made the first time (sharing it if this upload asks to)."""
    final = datasets_dir(settings) / f"{dataset_id}.jsonl"
    sha256 = spool.sha.hexdigest()
    found = _existing(session, user, sha256) if spool.size else None
    if found is not None:
        spool.discard()
        found.shared = found.shared or shared
        session.flush()
        return DatasetCreated(**_read(found, user.name).model_dump(), sample=_sample(Path(found.path))), False
    try:
        if spool.size == 0:
            raise InvalidInput.for_field("dataset", "the upload is empty")
        info = inspect_dataset(spool.path, declared, max_rows=settings.max_dataset_rows,
                               max_bytes=settings.max_body_bytes)
        _to_jsonl(spool.path, final)
    except DatasetError as exc:
        final.unlink(missing_ok=True)
        raise _dataset_error(exc) from exc
    finally:
        spool.discard()
    row = Dataset(id=dataset_id, owner_id=user.user_id, name=name, path=str(final), format=info.format,
                  num_rows=info.num_rows, size_bytes=final.stat().st_size, sha256=sha256, shared=shared)
    session.add(row)
    try:
        session.flush()
    except Exception:
        final.unlink(missing_ok=True)
        raise
    return DatasetCreated(**_read(row, user.name).model_dump(), sample=info.sample), True


def _read(row: Dataset, owner: str) -> DatasetRead:
    return DatasetRead(id=row.id, name=row.name, owner=owner, format=row.format, num_rows=row.num_rows,
                       size_bytes=row.size_bytes, sha256=row.sha256, shared=row.shared,
                       created_at=row.created_at)


def _visible(session: Session, settings: Settings, user: Principal, dataset_id: str) -> tuple[Dataset, str]:
    """The dataset and its owner's name, or 404 if unknown or not the caller's to read."""
    found = session.execute(select(Dataset, User.name).join(User, User.id == Dataset.owner_id)
                            .where(Dataset.id == dataset_id)).first()
    if found is None or not may_use_dataset(user, found[0].owner_id, found[0].shared, settings):
        raise NotFound(f"no dataset {dataset_id}", errors=[FieldError("dataset_id", "no such dataset")])
    return found[0], found[1]


def get_dataset(session: Session, settings: Settings, user: Principal, dataset_id: str) -> DatasetRead:
    """The dataset, or 404 if unknown or not the caller's to read (see :mod:`api.auth.access`)."""
    return _read(*_visible(session, settings, user, dataset_id))


def update_dataset(session: Session, settings: Settings, user: Principal, dataset_id: str,
                   change: DatasetUpdate) -> DatasetRead:
    """Share, unshare or rename a dataset: its owner's or an admin's call (403 to others who see it)."""
    row, owner = _visible(session, settings, user, dataset_id)
    if row.owner_id != user.user_id and not user.is_admin:
        raise Forbidden(f"dataset {dataset_id} is {owner}'s to share",
                        errors=[FieldError("shared", "only the owner or an admin changes it")])
    if change.shared is not None:
        row.shared = change.shared
    if change.name is not None:
        row.name = safe_name(change.name, row.id)
    session.flush()
    return _read(row, owner)


def list_datasets(session: Session, settings: Settings, user: Principal, after: str | None,
                  limit: int) -> DatasetList:
    """The caller's datasets and those shared with the team (everyone's for an admin, or with team
    reads), newest first."""
    query = (select(Dataset, User.name).join(User, User.id == Dataset.owner_id)
             .order_by(Dataset.id.desc()).limit(limit + 1))
    if not sees_everything(user, settings):
        query = query.where(or_(Dataset.owner_id == user.user_id, Dataset.shared.is_(True)))
    if after:
        query = query.where(Dataset.id < after)
    rows = session.execute(query).all()
    items = [_read(ds, owner) for ds, owner in rows[:limit]]
    return DatasetList(items=items, next_after=items[-1].id if len(rows) > limit else None)


def safe_name(raw: str | None, fallback: str) -> str:
    name = (raw or "").strip() or fallback
    name = os.path.basename(name)[:200]
    if not name.isprintable():
        raise InvalidInput.for_field("name", "must be printable text")
    return name
