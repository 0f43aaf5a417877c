"""Every failure class, reached by the real training process or the real worker through its cause.

Through a Celery worker (Redis, Postgres) that runs ``worker.train`` and ``worker.evaluate`` on the CPU
standing in for one card, each job's ``failure_kind`` and ``failure_reason`` read from its row:
an 8-bit optimizer without CUDA, LoRA targets the model lacks, a job folder the worker cannot
create, a training process that crashes, an evaluation that crashes. Through the training process
alone: a plan for CUDA where torch sees no GPU. On a machine with an NVIDIA GPU (``gpu`` marker): a
leased card that is not the one the process sees, and a run that outgrows its allocator limit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from store.db import session_scope
from store.models import Job, JobEvent
from store.states import JobStatus
from tests.tinydata import write_dataset
from tests.worker.conftest import db_url  # noqa: F401  (a migrated Postgres database per module)
from tests.worker.factories import make_job, make_user
from tests.worker.harness import WorkerProcess, job_row, send, wait_for, wait_status, worker_env
from tests.worker_train import planned
from tests.worker_train.conftest import LORA_TARGETS, TORCH_EXT
from tests.worker_train.planned import Mode, spec_of
from worker import launcher
from worker.supervise import read_failure

pytestmark = pytest.mark.slow
S = JobStatus
TERMINAL = {S.SUCCEEDED, S.FAILED, S.CANCELLED}
LORA = Mode(2, "fp32", "adamw", "lora", 5e-3, steps=2)
OTHER_CARD = "GPU-5d1f3b9e-0000-4000-8000-000000000001"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("failures-data") / "alpaca.jsonl", "alpaca", n=24)


@pytest.fixture(scope="module")
def worker(db_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    home = tmp_path_factory.mktemp("failures-worker")
    env = worker_env(db_url, redis_url, home, train_module="worker.train", eval_module="worker.evaluate",
                     progress_interval_s=0.3, cancel_grace_s=5, lease_ttl_s=60,
                     torch_extensions_dir=TORCH_EXT)
    env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"})
    proc = WorkerProcess(env, home / "worker.log").start()
    yield proc
    proc.stop()


def submit(worker: WorkerProcess, spec: dict[str, Any], *, send_task: bool = True) -> str:
    """A job row as the API stores it (spec and the planner's plan), then its run task."""
    planned_row = planned.planned_job(spec, 1)
    with session_scope(worker.settings.resolved_database_url) as s:
        job_id = make_job(s, make_user(s), spec=spec, plan=planned_row.plan,
                          peak=planned_row.plan["per_gpu"]["total_bytes"]).id
    if send_task:
        send(worker.settings, job_id)
    return job_id


def finished(worker: WorkerProcess, job_id: str, timeout: float = 300) -> Job:
    return wait_status(worker.settings.resolved_database_url, job_id, TERMINAL, timeout, worker)


def pids_of(url: str, job_id: str, kind: str) -> list[int]:
    with session_scope(url) as s:
        events = s.scalars(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == kind)).all()
        return [int(e.data["pids"][0] if "pids" in e.data else e.data["pid"]) for e in events
                if e.data and ("pids" in e.data or "pid" in e.data)]


def test_an_8bit_optimizer_without_cuda_is_optimizer_unavailable(worker: WorkerProcess, tiny_model: Path,
                                                                 data: Path) -> None:
    spec = spec_of(Mode(2, "fp32", "adamw_8bit", "lora", 1e-3, steps=2), tiny_model, data)
    job = finished(worker, submit(worker, spec))
    assert (job.status, job.failure_kind, job.failure_reason) == (S.FAILED, "user_error",
                                                                   "optimizer_unavailable")
    assert "adamw_8bit" in (job.failure_message or "")


def test_too_many_dropped_rows_is_rows_dropped_and_its_counts_are_kept_for_the_next_submit(
        worker: WorkerProcess, tiny_model: Path, tmp_path: Path) -> None:
    from store.dataset_reports import find_report
    from tests.tinydata import alpaca_rows, write_jsonl
    from tunebox.data_keys import report_keys

    rows = alpaca_rows(20) + [{"instruction": "Repeat the word: apple " * 40, "input": "", "output": "x"}] * 2
    long_rows = write_jsonl(tmp_path / "long.jsonl", rows)
    spec = spec_of(LORA, tiny_model, long_rows)
    spec["dataset"]["eval_fraction"] = 0.0
    job = finished(worker, submit(worker, spec))
    assert (job.status, job.failure_kind, job.failure_reason) == (S.FAILED, "user_error", "rows_dropped")
    assert "2 of 22 rows (9.1%)" in (job.failure_message or "")
    with session_scope(worker.settings.resolved_database_url) as s:
        keys = report_keys(long_rows, tiny_model)
        assert keys is not None
        kept = find_report(s, *keys, 64, "alpaca", None)
    assert kept is not None and (kept["rows"], kept["dropped_rows"], kept["seq_len"]) == (22, 2, 64)


def _replace_with_another_family(model: Path) -> None:
    """The folder's model swapped for a GPT-2 (``c_attn``, ``c_fc``, no ``q_proj``), tokenizer kept."""
    from transformers import GPT2Config, GPT2LMHeadModel

    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    for weights in model.glob("model*.safetensors"):
        weights.unlink()
    GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=1, n_head=2, n_positions=128)
                    ).save_pretrained(model)


def test_lora_targets_the_model_lacks_are_bad_lora_targets(worker: WorkerProcess, tiny_model: Path,
                                                           data: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    spec = spec_of(LORA, model, data)
    spec["lora"]["target_modules"] = LORA_TARGETS  # Llama's projections; GPT-2 has an lm_head too
    job_id = submit(worker, spec, send_task=False)  # planned for the Llama there
    _replace_with_another_family(model)  # before the job runs
    send(worker.settings, job_id)
    job = finished(worker, job_id)
    assert (job.status, job.failure_kind, job.failure_reason) == (S.FAILED, "user_error", "bad_lora_targets")
    assert "lora.target_modules" in (job.failure_message or "")


def test_a_job_folder_the_worker_cannot_create_is_worker_error(worker: WorkerProcess, tiny_model: Path,
                                                               data: Path) -> None:
    job_id = submit(worker, spec_of(LORA, tiny_model, data), send_task=False)
    blocked = launcher.job_dir(worker.settings, job_id)
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("a file where the job's folder goes")
    send(worker.settings, job_id)
    job = finished(worker, job_id)
    assert (job.status, job.failure_kind, job.failure_reason) == (S.FAILED, "error", "worker_error")
    assert str(blocked) in (job.failure_message or "")


def test_a_training_process_that_crashes_is_killed(worker: WorkerProcess, tiny_model: Path,
                                                   data: Path) -> None:
    url = worker.settings.resolved_database_url
    job_id = submit(worker, spec_of(Mode(2, "fp32", "adamw", "lora", 5e-3, steps=100_000), tiny_model, data))
    wait_for(lambda: (job_row(url, job_id).step or 0) >= 1, 300, "the first training step")
    (pid,) = pids_of(url, job_id, "process")
    os.kill(pid, signal.SIGSEGV)
    job = finished(worker, job_id, 60)
    assert (job.status, job.failure_kind, job.failure_reason) == (S.FAILED, "error", "killed")
    assert "SIGSEGV" in (job.failure_message or "")


def test_an_evaluation_that_crashes_fails_the_evaluation_by_its_exit_code_not_the_job(
        worker: WorkerProcess, tiny_model: Path, data: Path) -> None:
    url = worker.settings.resolved_database_url
    job_id = submit(worker, spec_of(Mode(2, "fp32", "adamw", "lora", 5e-3, steps=2, eval="end"), tiny_model,
                                    data))
    eval_pids = wait_for(lambda: pids_of(url, job_id, "eval"), 300, "the evaluation process")
    os.kill(eval_pids[0], signal.SIGSEGV)
    job = finished(worker, job_id, 60)
    assert job.status is S.SUCCEEDED, job.failure_message
    assert job.eval_status == "failed" and job.eval_result is not None
    assert (job.eval_result["reason"], job.eval_result["exit_code"]) == ("killed", -signal.SIGSEGV)


# ------------------------------------------------------------------ the training process alone


def test_a_cuda_plan_where_torch_sees_no_gpu_is_no_gpu(tmp_path: Path, tiny_model: Path, data: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    grant = planned.gpu_grant([OTHER_CARD])  # a card the box's NVML listed
    code = planned.train_alone(tmp_path / "job", grant, spec_of(LORA, tiny_model, data))
    failure = read_failure(tmp_path / "job" / "failure.json")
    assert failure is not None and (failure.kind, failure.reason) == ("error", "no_gpu")
    assert code == 1


@pytest.mark.gpu
def test_a_leased_card_other_than_the_visible_one_is_gpu_mismatch(tmp_path: Path, tiny_model: Path,
                                                                   data: Path) -> None:
    grant = planned.gpu_grant(planned.nvml_uuids()[:1])
    spec = spec_of(LORA, tiny_model, data)
    assert planned.train_alone(tmp_path / "leased", grant, spec) == 0  # the card it was leased
    code = planned.train_alone(tmp_path / "other", grant, spec,
                                     env_changes={"TUNEBOX_EXPECTED_GPU_UUIDS": OTHER_CARD})
    failure = read_failure(tmp_path / "other" / "failure.json")
    assert failure is not None and (failure.kind, failure.reason) == ("error", "gpu_mismatch")
    assert OTHER_CARD.lower().removeprefix("gpu-") in failure.message and code == 1


@pytest.mark.gpu
def test_a_run_past_its_allocator_limit_is_cuda_oom_with_its_figures(tmp_path: Path, tiny_model: Path,
                                                                     data: Path) -> None:
    grant = planned.gpu_grant(planned.nvml_uuids()[:1])
    limit = 2**20  # below the allocator's smallest segment (2 MiB): the first tensor on the card is past it
    spec = spec_of(Mode(0, "fp32", "adamw", "full", 1e-3, steps=2), tiny_model, data)
    code = planned.train_alone(tmp_path / "job", grant, spec, gpu_memory_limit_bytes=limit)
    raw = json.loads((tmp_path / "job" / "failure.json").read_text())
    assert (raw["kind"], raw["reason"], code) == ("error", "cuda_oom", 3)
    assert raw["data"]["gpu_memory_limit_bytes"] == limit
    assert raw["data"]["max_reserved_bytes"] <= limit and raw["data"]["requested_bytes"] > 0
