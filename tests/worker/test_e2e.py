"""End to end: jobs submitted over HTTP run through the real worker and real DeepSpeed ZeRO-3.

Production layout (Postgres, Redis, ``tunebox serve`` for the API only, a Celery worker process)
and the embedded one (``tunebox serve`` alone: SQLite, the filesystem broker, a worker beside the
API). The "GPU" is the CPU standing in for one 24 GiB card; the model is a tiny local Llama.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.tinydata import write_dataset, write_jsonl
from tests.tinymodel import build_tiny_model
from tests.worker.harness import ApiServer, WorkerProcess, wait_job, worker_env

pytestmark = pytest.mark.slow
TERMINAL = {"succeeded", "failed", "cancelled"}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("e2e")
    build_tiny_model(base / "models" / "tiny")
    write_dataset(base / "data" / "repeat.jsonl", "alpaca", n=48)
    bad = [{"instruction": "Repeat the word: river", "input": "", "output": "river river river"}] * 40
    bad[7] = {"instruction": "Repeat the word: stone"}  # no output
    write_jsonl(base / "data" / "broken.jsonl", bad)
    return {"base": base, "models": base / "models", "data": base / "data"}


def _env(db_url: str, broker: str | None, roots: dict[str, Path], data_dir: Path) -> dict[str, str]:
    env = worker_env(db_url, broker, data_dir, train_module="worker.train", eval_module="worker.evaluate",
                     model_roots=json.dumps([str(roots["models"])]),
                     dataset_roots=json.dumps([str(roots["data"])]),
                     progress_interval_s=0.3, cancel_grace_s=5, lease_ttl_s=60)
    env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    return env


def spec(roots: dict[str, Path], method: str = "lora", dataset: str = "repeat.jsonl",
         **dataset_extra: Any) -> dict[str, Any]:
    return {
        "name": f"e2e-{method}", "model": {"path": "tiny"},
        "dataset": {"path": dataset, "format": "alpaca", "eval_fraction": 0.1, **dataset_extra},
        "method": method,
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": LORA_TARGETS},
        "training": {"max_steps": 12, "epochs": None, "learning_rate": 5e-3 if method == "lora" else 1e-3,
                     "lr_scheduler": "constant", "warmup_ratio": 0.0, "micro_batch_size": 4,
                     "gradient_accumulation_steps": 1, "seq_len": 64, "precision": "fp32",
                     "save_steps": 6, "seed": 7},
        "resources": {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
        "eval": {"when": "end", "max_new_tokens": 8, "batch_size": 2, "num_samples": 2},
    }


@pytest.fixture(scope="module")
def stack(db_url, redis_url, roots, tmp_path_factory):
    data = tmp_path_factory.mktemp("e2e-data")
    env = _env(db_url, redis_url, roots, data)
    api = ApiServer(env, data / "api.log").start()
    worker = WorkerProcess(env, data / "worker.log").start()
    with api.client() as client:
        yield client, api, worker
    worker.stop()
    api.stop()


def _submit(client, body: dict[str, Any]) -> str:
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def _losses(client, job_id: str) -> list[float]:
    points = client.get(f"/v1/jobs/{job_id}/metrics").json()["points"]
    return [p["loss"] for p in sorted(points, key=lambda p: p["step"]) if p["loss"] is not None]


def _training_pids(client, job_id: str) -> set[int]:
    events = client.get(f"/v1/jobs/{job_id}/events").json()["items"]
    return {pid for e in events if e["kind"] == "process" for pid in e["data"]["pids"]}


def _no_leases(client) -> bool:
    return all(not g["leases"] for g in client.get("/v1/gpus").json()["items"])


def _final_path(client, job_id: str) -> Path:
    items = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
    return Path(next(c["path"] for c in items if c["is_final"]))


def test_lora_job_runs_to_success_and_its_adapter_loads(stack, roots):
    client, api, worker = stack
    job_id = _submit(client, spec(roots))
    job = wait_job(client, job_id, TERMINAL, 600, worker, api)
    assert job["status"] == "succeeded", (job["failure"], job["log_tail"])
    losses = _losses(client, job_id)
    assert len(losses) >= 2 and losses[-1] < losses[0]
    assert job["eval_status"] == "succeeded" and job["eval_result"]["eval_loss"] is not None
    assert job["eval_result"]["pid"] not in _training_pids(client, job_id)
    assert job["progress"]["measured_host_rss_bytes"] > 0 and job["planned_peak_gpu_bytes"] > 0
    assert _no_leases(client)
    statuses = [e["data"]["to"] for e in client.get(f"/v1/jobs/{job_id}/events").json()["items"]
                if e["kind"] == "status"]
    assert statuses[-3:] == ["running", "evaluating", "succeeded"]

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(roots["models"] / "tiny")
    model = PeftModel.from_pretrained(base, str(_final_path(client, job_id)))
    assert any("lora_A" in name for name, _ in model.named_parameters())


def test_full_finetune_job_and_a_broken_dataset(stack, roots):
    client, api, worker = stack
    full = _submit(client, spec(roots, method="full"))
    # num_rows declared: the API takes the user's word and does not read the file; the training does
    broken = _submit(client, spec(roots, dataset="broken.jsonl", num_rows=40))
    job = wait_job(client, full, TERMINAL, 600, worker, api)
    assert job["status"] == "succeeded", (job["failure"], job["log_tail"])
    losses = _losses(client, full)
    assert losses[-1] < losses[0]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(_final_path(client, full)) is not None
    failed = wait_job(client, broken, TERMINAL, 300, worker, api)
    assert failed["status"] == "failed" and failed["failure"]["kind"] == "user_error", failed["failure"]
    assert failed["log_tail"]
    assert _no_leases(client)


def test_embedded_serve_runs_a_job_on_sqlite_and_the_filesystem_broker(roots, tmp_path):
    data = tmp_path / "embedded"
    env = _env(f"sqlite:///{data / 'tunebox.db'}", None, roots, data)
    env.pop("TUNEBOX_DATABASE_URL")  # the embedded default: DATA_DIR/tunebox.db
    api = ApiServer(env, tmp_path / "serve.log").start()
    try:
        with api.client() as client:
            job_id = _submit(client, spec(roots))
            job = wait_job(client, job_id, TERMINAL, 600, api)
            assert job["status"] == "succeeded", (job["failure"], job["log_tail"])
            assert job["eval_status"] == "succeeded"
            assert _no_leases(client)
    finally:
        code = api.stop()
    assert code == 0
    assert (data / "tunebox.db").exists() and (data / "broker" / "queue").is_dir()
