"""What training makes of a dataset with a tokenizer at a ``seq_len``, kept by the identity of both.

A report comes from ``worker/inspect_data.py`` (``POST /v1/datasets/inspect``) or from a job's
trainer; the API looks one up when a job is submitted and refuses, with the counts, a job whose rows
would be dropped past ``dataset.max_dropped_fraction``. The keys are ``tunebox/data_keys.py``'s.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import DatasetReport


def save_report(session: Session, dataset: str, model: str, seq_len: int, fmt: str, name: str | None,
                report: dict[str, Any]) -> None:
    """Keep ``report``, replacing an earlier one of the same keys."""
    row = _find(session, dataset, model, seq_len, fmt, name)
    if row is None:
        session.add(DatasetReport(dataset_key=dataset, model_key=model, seq_len=seq_len, format=fmt,
                                  name=name or "", report=report))
    else:
        row.report = report


def find_report(session: Session, dataset: str, model: str, seq_len: int, fmt: str, name: str | None
                ) -> dict[str, Any] | None:
    return session.scalar(select(DatasetReport.report).where(*_key(dataset, model, seq_len, fmt, name)))


def _find(session: Session, dataset: str, model: str, seq_len: int, fmt: str, name: str | None
          ) -> DatasetReport | None:
    return session.scalars(select(DatasetReport).where(*_key(dataset, model, seq_len, fmt, name))).first()


def _key(dataset: str, model: str, seq_len: int, fmt: str, name: str | None) -> tuple[Any, ...]:
    return (DatasetReport.dataset_key == dataset, DatasetReport.model_key == model,
            DatasetReport.seq_len == seq_len, DatasetReport.format == fmt, DatasetReport.name == (name or ""))
