"""The ``openai`` SDK driving real training: ``tunebox serve`` and a Celery worker on Postgres + Redis,
and the embedded default (``tunebox serve`` alone: SQLite and the server-less broker). A tiny local
Llama trains with DeepSpeed ZeRO-3 on the CPU, which stands in for one 24 GiB card."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import create_pg_database, drop_pg_database
from tests.tinydata import messages_rows, write_jsonl
from tests.tinymodel import build_tiny_model
from tests.worker.conftest import migrate
from tests.worker.harness import ApiServer, WorkerProcess, wait_for, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]
DONE = {"succeeded", "failed", "cancelled"}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
PAUSED_RUN_STEPS = 120  # a tiny model steps fast once running: long enough for the pause to land mid-run
TIMEOUT = 1200  # a shared CPU box may be slow to start a DeepSpeed run


def knobs(max_steps: int, save_steps: int) -> dict[str, Any]:
    """tunebox's own fields through the SDK's extra_body: a small, fast LoRA run on the CPU."""
    return {
        "tunebox": {
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": TARGETS},
            "dataset": {"eval_fraction": 0.1},
            "training": {
                "max_steps": max_steps,
                "epochs": None,
                "lr_scheduler": "constant",
                "warmup_ratio": 0.0,
                "micro_batch_size": 4,
                "gradient_accumulation_steps": 1,
                "seq_len": 64,
                "precision": "fp32",
                "save_steps": save_steps,
            },
            "resources": {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
            "eval": {"when": "none"},
        }
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("sdk")
    build_tiny_model(base / "models" / "tiny")
    (base / "data").mkdir()
    return {
        "models": base / "models",
        "data": base / "data",
        "chat": write_jsonl(base / "chat.jsonl", messages_rows(48)),
    }


def _env(db_url: str, broker: str | None, files: dict[str, Path], data_dir: Path) -> dict[str, str]:
    env = worker_env(
        db_url,
        broker,
        data_dir,
        train_module="worker.train",
        eval_module="worker.evaluate",
        model_roots=json.dumps([str(files["models"])]),
        dataset_roots=json.dumps([str(files["data"])]),
        progress_interval_s=0,  # every step: the metrics events are checked step by step
        cancel_grace_s=5,
        lease_ttl_s=60,
        # the test run's own cache of DeepSpeed's compiled ops (scripts/test sets it)
        torch_extensions_dir=os.environ.get("TORCH_EXTENSIONS_DIR", str(data_dir / "torch_extensions")),
    )
    env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    return env


def _client(api: ApiServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.base_url}/v1", api_key=api.token, timeout=60)


def _wait(client: openai.OpenAI, job_id: str, check: Any, timeout: float, what: str, *logs: Any) -> Any:
    last: Any = None

    def done() -> bool:
        nonlocal last
        last = client.fine_tuning.jobs.retrieve(job_id)
        return bool(check(last))

    try:
        wait_for(done, timeout, f"{job_id} {what}", every=0.5)
    except AssertionError as exc:
        tails = "\n".join(src.log_text()[-3000:] for src in logs)
        with logs[0].client() as http:
            train_log = http.get(f"/v1/jobs/{job_id}/logs", params={"tail": 40}).text
        raise AssertionError(
            f"{exc}; last {last and last.model_extra['tunebox']}\n{train_log}\n{tails}"
        ) from None
    return last


def _losses(api: ApiServer, job_id: str) -> dict[int, float]:
    with api.client() as http:
        points = http.get(f"/v1/jobs/{job_id}/metrics").json()["points"]
    return {p["step"]: p["loss"] for p in points if p["loss"] is not None}


def _no_leases(api: ApiServer) -> bool:
    with api.client() as http:
        return all(not g["leases"] for g in http.get("/v1/gpus").json()["items"])


def _train_to_success(client: openai.OpenAI, file_id: str, *logs: Any) -> Any:
    job = client.fine_tuning.jobs.create(
        model="tiny",
        training_file=file_id,
        suffix="repeat",
        hyperparameters={"learning_rate_multiplier": 25},
        extra_body=knobs(max_steps=8, save_steps=4),
    )
    done = _wait(client, job.id, lambda j: j.status in DONE, TIMEOUT, "to finish", *logs)
    assert done.status == "succeeded", (done.error, done.model_extra["tunebox"])
    assert done.fine_tuned_model == f"ft:tiny:repeat:{job.id}" and done.trained_tokens == 8 * 4 * 64
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
    metrics = [e for e in events if e.type == "metrics"]
    # the worker writes progress at a bounded rate: the first step, the last, and what fell between
    steps = sorted(e.data["step"] for e in metrics)
    assert steps[0] == 1 and steps[-1] == 8 and len(set(steps)) == len(steps)
    assert set(steps) <= set(range(1, 9))
    assert all(isinstance(e.data["train_loss"], float) for e in metrics)
    assert metrics[0].data["train_loss"] < metrics[-1].data["train_loss"]  # newest first: it learned
    assert any(e.type == "message" and e.data.get("to") == "succeeded" for e in events)
    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in checkpoints] == [8, 4]
    assert all(c.metrics.train_loss is not None for c in checkpoints)
    csv_text = client.files.content(done.result_files[0]).text.splitlines()
    assert csv_text[0] == "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy"
    assert len(csv_text) == 1 + len(steps)
    return done


@pytest.fixture(scope="module")
def stack(files, redis_url, tmp_path_factory):
    """tunebox serve (the API only) and one Celery worker on Postgres and Redis."""
    data = tmp_path_factory.mktemp("sdk-stack")
    db_url = create_pg_database("tunebox_sdk")
    migrate(db_url)
    env = _env(db_url, redis_url, files, data)
    api = ApiServer(env, data / "api.log").start()
    worker = WorkerProcess(env, data / "worker.log").start()
    with files["chat"].open("rb") as fh:
        file = _client(api).files.create(file=fh, purpose="fine-tune")
    yield api, worker, file.id
    worker.stop()
    api.stop()
    drop_pg_database(db_url)


def test_a_paused_job_frees_its_gpu_and_resumes_from_its_checkpoint(stack):
    api, worker, file_id = stack
    client = _client(api)
    job = client.fine_tuning.jobs.create(
        model="tiny",
        training_file=file_id,
        hyperparameters={"learning_rate_multiplier": 25},
        extra_body=knobs(max_steps=PAUSED_RUN_STEPS, save_steps=1000),
    )
    _wait(
        client,
        job.id,
        lambda j: (j.model_extra["tunebox"]["step"] or 0) >= 3,
        TIMEOUT,
        "to train",
        api,
        worker,
    )
    client.fine_tuning.jobs.pause(job.id)
    paused = _wait(client, job.id, lambda j: j.status == "paused", TIMEOUT, "to pause", api, worker)
    at = paused.model_extra["tunebox"]["step"]
    assert 3 <= at < PAUSED_RUN_STEPS and _no_leases(api)
    assert [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data] == [at]
    before = _losses(api, job.id)
    assert min(before) == 1 and max(before) <= at
    time.sleep(2)
    assert client.fine_tuning.jobs.retrieve(job.id).model_extra["tunebox"]["step"] == at  # nothing runs
    client.fine_tuning.jobs.resume(job.id)
    done = _wait(client, job.id, lambda j: j.status in DONE, TIMEOUT, "to finish", api, worker)
    assert done.status == "succeeded", (done.error, done.model_extra["tunebox"])
    losses = _losses(api, job.id)
    assert max(losses) == PAUSED_RUN_STEPS and set(losses) <= set(range(1, PAUSED_RUN_STEPS + 1))
    assert {s: losses[s] for s in before} == before  # the steps before the pause ran once
    resumed = min(s for s in losses if s > at)
    assert losses[resumed] < losses[1]  # it continued from the checkpoint, not from the start
    with api.client() as http:
        events = http.get(f"/v1/jobs/{job.id}/events", params={"limit": 1000}).json()["items"]
    moves = [e["data"]["to"] for e in events if e["kind"] == "status"]
    assert moves == ["starting", "running", "pausing", "paused", "queued", "starting", "running", "succeeded"]
    starts = [e for e in events if e["kind"] == "process" and "training started" in e["message"]]
    assert len(starts) == 2  # the resumed run is a new process


def test_a_job_trains_to_success_and_another_is_cancelled(stack):
    api, worker, file_id = stack
    client = _client(api)
    _train_to_success(client, file_id, api, worker)
    assert _no_leases(api)
    doomed = client.fine_tuning.jobs.create(
        model="tiny", training_file=file_id, extra_body=knobs(max_steps=400, save_steps=1000)
    )
    _wait(
        client,
        doomed.id,
        lambda j: (j.model_extra["tunebox"]["step"] or 0) >= 1,
        TIMEOUT,
        "to train",
        api,
        worker,
    )
    client.fine_tuning.jobs.cancel(doomed.id)
    gone = _wait(
        client,
        doomed.id,
        lambda j: j.model_extra["tunebox"]["status"] == "cancelled",
        120,
        "to be cancelled",
        api,
        worker,
    )
    assert gone.status == "cancelled" and _no_leases(api)


def test_the_sdk_trains_on_the_embedded_default(files, tmp_path):
    data = tmp_path / "embedded"
    env = _env(f"sqlite:///{data / 'tunebox.db'}", None, files, data)
    env.pop("TUNEBOX_DATABASE_URL")  # the embedded default: DATA_DIR/tunebox.db
    api = ApiServer(env, tmp_path / "serve.log").start()
    try:
        client = _client(api)
        with files["chat"].open("rb") as fh:
            file = client.files.create(file=fh, purpose="fine-tune")
        _train_to_success(client, file.id, api)
        assert _no_leases(api)
    finally:
        assert api.stop() == 0
