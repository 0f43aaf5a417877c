"""``POST /v1/datasets/inspect``: what training would make of a dataset, with a model's tokenizer.

The tokenising runs in a child process (``python -m worker.inspect_data``) so the API process never
imports transformers; its report comes back as the response.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from api.auth.access import may_use_dataset
from api.auth.service import Principal
from api.errors import FieldError, InvalidInput, ServiceUnavailable
from api.paths import confine
from store.dataset_reports import save_report
from store.models import Dataset
from tunebox.settings import Settings

INSPECT_TIMEOUT_S = 600


class InspectDataset(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    id: Annotated[str, Field(pattern=r"^ds_[A-Za-z0-9]{1,64}$")] | None = None
    format: str = "auto"
    name: Annotated[str, Field(min_length=1, max_length=256)] | None = None


class InspectModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1, max_length=4096)]


class InspectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: InspectDataset
    model: InspectModel
    seq_len: Annotated[int, Field(ge=8, le=1_048_576)] = 1024


def _dataset_file(session: Session, settings: Settings, user: Principal, ds: InspectDataset) -> Path:
    if (ds.path is None) == (ds.id is None):
        raise InvalidInput.for_field("dataset", "needs exactly one of path, id")
    if ds.id is not None:
        row = session.get(Dataset, ds.id)
        if row is None or not may_use_dataset(user, row.owner_id, row.shared, settings):
            raise InvalidInput.for_field("dataset.id", f"no dataset {ds.id}")
        return Path(row.path)
    assert ds.path is not None
    return confine(ds.path, settings.dataset_roots, "dataset.path")


def inspect(session: Session, settings: Settings, user: Principal, request: InspectRequest) -> dict[str, Any]:
    """The trainer's account of the dataset (see ``worker/inspect_data.py``), or a 422 naming the field."""
    data = _dataset_file(session, settings, user, request.dataset)
    model = confine(request.model.path, settings.model_roots, "model.path")
    argv = [
        sys.executable,
        "-m",
        "worker.inspect_data",
        str(data),
        "--model",
        str(model),
        "--seq-len",
        str(request.seq_len),
        "--format",
        request.dataset.format,
    ]
    if request.dataset.name:
        argv += ["--name", request.dataset.name]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=INSPECT_TIMEOUT_S,
            cwd=Path(__file__).resolve().parents[2],
        )
    except subprocess.TimeoutExpired:
        raise ServiceUnavailable(f"inspecting took longer than {INSPECT_TIMEOUT_S} s") from None
    try:
        report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise ServiceUnavailable(f"inspecting failed: {done.stderr[-500:]}") from None
    if "error" in report:
        error = report["error"]
        field = error["field"]
        if not field.startswith(("dataset", "model")):
            field = f"dataset.rows[{error['row']}].{field}"
        raise InvalidInput(f"{field}: {error['message']}", errors=[FieldError(field, error["message"])])
    _keep(session, data, model, request, report)
    return report


def _keep(session: Session, data: Path, model: Path, request: InspectRequest, report: dict[str, Any]) -> None:
    """Keep the counts under the file's and tokenizer's keys: a job submitted on them later is refused
    at once if it would drop too many rows."""
    from tunebox.data_keys import report_keys

    if (keys := report_keys(data, model)) is not None:
        counts = {k: v for k, v in report.items() if k not in ("example", "format")}
        save_report(session, *keys, request.seq_len, request.dataset.format, request.dataset.name, counts)
