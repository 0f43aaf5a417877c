"""Two jobs on one card: a real Celery worker with its threads pool and concurrency 2 runs two real
trainings at once on the one stand-in card (the CPU), each training process held to its own plan.

On the CPU there is no allocator to limit (the run file says ``null`` and the training reports it
holds none); on a machine with an NVIDIA GPU the same test checks that each process reports the
limit its own plan gives it (``per_gpu.allocator_limit_bytes`` plus the tolerance).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from store.db import session_scope
from store.models import Gpu, JobEvent
from store.states import JobStatus
from tests.tinydata import write_dataset
from tests.worker.conftest import db_url  # noqa: F401  (a migrated Postgres database per module)
from tests.worker.factories import make_job, make_user
from tests.worker.harness import WorkerProcess, send, wait_status, worker_env
from tests.worker_train import planned
from tests.worker_train.conftest import TORCH_EXT
from tests.worker_train.planned import Mode, spec_of
from worker import launcher
from worker.leasing import Grant

pytestmark = pytest.mark.slow
TERMINAL = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}


def _records(job_dir: Path) -> dict[str, dict[str, Any]]:
    lines = (job_dir / "progress.jsonl").read_text().splitlines()
    return {r["type"]: r for r in map(json.loads, lines) if r["type"] in ("start", "done")}


def _held(url: str, job_id: str) -> tuple[datetime, datetime]:
    """When the job took its card (``starting``: the lease and the move are one transaction) and
    when it gave it back (its terminal move)."""
    with session_scope(url) as s:
        moves = {e.data["to"]: e.created_at for e in s.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "status"))}
    return moves["starting"], moves["succeeded"]


def test_two_jobs_share_one_card_through_the_threads_pool(db_url: str, redis_url: str,  # noqa: F811
                                                          tiny_model: Path, tmp_path: Path) -> None:
    import torch

    data = write_dataset(tmp_path / "alpaca.jsonl", "alpaca", n=24)
    env = worker_env(db_url, redis_url, tmp_path / "home", train_module="worker.train",
                     eval_module="worker.evaluate", progress_interval_s=0.3, lease_ttl_s=60,
                     torch_extensions_dir=TORCH_EXT, worker_concurrency=2)
    env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"})
    worker = WorkerProcess(env, tmp_path / "worker.log", pool="threads", concurrency=2).start()
    url = worker.settings.resolved_database_url
    try:
        plans, ids = {}, []
        for lr in (5e-3, 2e-3):  # two different jobs, each planned alone for the one card
            spec = spec_of(Mode(2, "fp32", "adamw", "lora", lr, steps=20), tiny_model, data)
            row = planned.planned_job(spec, 1)
            with session_scope(url) as s:
                job_id = make_job(s, make_user(s), spec=spec, plan=row.plan,
                                  peak=row.plan["per_gpu"]["total_bytes"]).id
            plans[job_id] = row.plan
            ids.append(job_id)
        for job_id in ids:
            send(worker.settings, job_id)
        jobs = [wait_status(url, job_id, TERMINAL, 600, worker) for job_id in ids]
        with session_scope(url) as s:
            (card,) = s.scalars(select(Gpu).where(Gpu.host == worker.settings.worker_host)).all()
            grant = Grant(gpu_ids=(card.id,), indices=(card.index,), uuids=(card.uuid,), exclusive=False)
    finally:
        worker.stop()
    for job in jobs:
        assert job.status is JobStatus.SUCCEEDED, (job.failure_reason, job.failure_message)
        assert job.gpu_indices == [card.index]
    runs = {job.id: _records(launcher.job_dir(worker.settings, job.id)) for job in jobs}
    (a_taken, a_freed), (b_taken, b_freed) = (_held(url, i) for i in ids)
    # both held the card at once (each took it before the other gave it back), and trained in
    # processes of their own; when each process's training steps fall is up to how fast it starts
    assert a_taken < b_freed and b_taken < a_freed
    assert runs[ids[0]]["start"]["pid"] != runs[ids[1]]["start"]["pid"]
    for job in jobs:
        written = json.loads((launcher.job_dir(worker.settings, job.id) / "run.json").read_text())
        expected = launcher.gpu_memory_limit(plans[job.id], grant, worker.settings)
        assert written["gpu_memory_limit_bytes"] == expected
        assert runs[job.id]["start"]["gpu_memory_limit_bytes"] == expected
        if torch.cuda.is_available():
            assert expected is not None and expected >= plans[job.id]["per_gpu"]["allocator_limit_bytes"]
