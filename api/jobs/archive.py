"""A checkpoint (or the final model) of a job as a ``.tar.gz`` archive: the adapter or model folder
with its tokenizer, without DeepSpeed's resume state (``ds/``) unless asked for."""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path
from typing import IO

from sqlalchemy.orm import Session

from api.errors import FieldError, NotFound
from store import checkpoints
from store.models import Checkpoint

RESUME_STATE = "ds"


def find_checkpoint(session: Session, job_id: str, step: int | None) -> Checkpoint:
    """The checkpoint of ``step``, or the final one (the newest where there is no final)."""
    found = (checkpoints.at_step(session, job_id, step) if step is not None
             else checkpoints.final_or_newest(session, job_id))
    if found is None or not Path(found.path).is_dir():
        what = f"no checkpoint at step {step}" if step is not None else "no checkpoint yet"
        raise NotFound(f"{job_id} has {what}", errors=[FieldError("step", what)])
    return found


def build(folder: Path, name: str, *, with_state: bool) -> IO[bytes]:
    """The folder as a gzip'd tar under ``name/``, in a temporary file positioned at its start."""
    out = tempfile.TemporaryFile()  # noqa: SIM115 - the caller streams it and closes it
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if not with_state and relative.parts[0] == RESUME_STATE:
                continue
            if path.is_file() and not path.is_symlink():
                tar.add(path, arcname=str(Path(name) / relative), recursive=False)
    out.seek(0)
    return out
