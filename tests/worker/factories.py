"""Rows the worker tests need: a user and jobs with a stored spec and plan."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from store.base import utcnow
from store.ids import new_id
from store.models import Job, User

GIB = 2**30


def make_user(session: Session, name: str | None = None) -> User:
    user = User(id=new_id("usr"), name=name or new_id("name"))
    session.add(user)
    session.flush()
    return user


def job_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "test-job",
        "model": {"path": "/models/tiny"},
        "dataset": {"path": "/data/tiny.jsonl", "format": "alpaca"},
        "method": "lora",
        "training": {"max_steps": 4, "epochs": None, "seq_len": 32},
        "eval": {"when": "none"},
    }
    spec.update(overrides)
    return spec


def job_plan(num_gpus: int = 1, peak: int | None = 10 * GIB, eval_fits: bool = True) -> dict[str, Any]:
    return {
        "fits": True,
        "num_gpus": num_gpus,
        "resolved": {"micro_batch_size": 1, "gradient_accumulation_steps": 1,
                     "gradient_checkpointing": False, "zero_stage": 3, "offload_optimizer": "cpu",
                     "offload_param": "cpu", "num_gpus": num_gpus, "precision": "fp32",
                     "loss_chunk_tokens": 512, "attn_implementation": "sdpa"},
        "deepspeed_config": {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                             "zero_optimization": {"stage": 3}},
        "per_gpu": {"total_bytes": peak},
        "eval": {"total_bytes": (peak or GIB) // 4, "fits": True, "fits_beside_training": eval_fits},
    }


def make_job(session: Session, owner: User, *, priority: int = 0, num_gpus: int = 1,
             peak: int | None = 10 * GIB, age_s: float = 0.0, spec: dict[str, Any] | None = None,
             plan: dict[str, Any] | None = None, **fields: Any) -> Job:
    job = Job(id=new_id("job"), owner_id=owner.id, name="test-job", priority=priority,
              spec=spec or job_spec(priority=priority), plan=plan or job_plan(num_gpus, peak),
              num_gpus=num_gpus, planned_peak_gpu_bytes=peak,
              created_at=utcnow() - timedelta(seconds=age_s), **fields)
    session.add(job)
    session.flush()
    return job
