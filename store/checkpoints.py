"""A job's checkpoints (``checkpoints``): the worker's records of them and the API's reads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from store.models import Checkpoint

__all__ = ["at_step", "at_steps", "final_or_newest", "of_job", "set_evaluation"]


def of_job(session: Session, job_id: str, *, newest_first: bool = False) -> list[Checkpoint]:
    order = Checkpoint.step.desc() if newest_first else Checkpoint.step
    return list(session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(order)))


def at_step(session: Session, job_id: str, step: int) -> Checkpoint | None:
    return session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
                           ).one_or_none()


def at_steps(session: Session, job_id: str, steps: Iterable[int]) -> list[Checkpoint]:
    return list(session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id,
                                                         Checkpoint.step.in_(list(steps)))))


def final_or_newest(session: Session, job_id: str) -> Checkpoint | None:
    """The final checkpoint, or the newest where there is no final."""
    return session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)
                           .order_by(Checkpoint.is_final.desc(), Checkpoint.step.desc()).limit(1)).first()


def set_evaluation(session: Session, job_id: str, step: int, ok: bool, result: dict[str, Any]) -> None:
    """What the evaluation of the checkpoint at ``step`` found."""
    session.execute(update(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
                    .values(eval_status="succeeded" if ok else "failed", eval_result=result)
                    .execution_options(synchronize_session=False))
