"""Fixtures for the training/evaluation process tests: a tiny model, job folders, subprocess runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.tinydata import write_dataset
from tests.tinymodel import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
TORCH_EXT = os.environ.get("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ds_config(*, stage: int = 3, offload: str = "cpu", lr: float = 5e-3, mbs: int = 4, ga: int = 1
              ) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": ga,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage, "offload_optimizer": {"device": offload},
                              "stage3_param_persistence_threshold": 0},
        "zero_force_ds_cpu_optimizer": False,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}},
    }


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_spec(model: Path, dataset: Path, *, method: str = "lora", max_steps: int | None = 12,
              epochs: float | None = None, save_steps: int = 100, lr: float = 5e-3, fmt: str = "auto",
              mbs: int = 4, ga: int = 1, eval_fraction: float = 0.1, precision: str = "fp32"
              ) -> dict[str, Any]:
    return {
        "name": "t", "model": {"path": str(model)},
        "dataset": {"path": str(dataset), "format": fmt, "eval_fraction": eval_fraction},
        "method": method,
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": LORA_TARGETS},
        "training": {"epochs": epochs, "max_steps": max_steps, "learning_rate": lr,
                     "lr_scheduler": "constant", "warmup_ratio": 0.0, "micro_batch_size": mbs,
                     "gradient_accumulation_steps": ga, "seq_len": 64, "gradient_checkpointing": True,
                     "precision": precision, "save_steps": save_steps, "seed": 7},
        "resources": {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "none"},
        "eval": {"max_new_tokens": 8, "batch_size": 2, "num_samples": 2},
    }


def write_run(job_dir: Path, spec: dict[str, Any], *, model: Path | None = None, dataset: Path | None = None,
              config: dict[str, Any] | None = None) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    t = spec["training"]
    run = {
        "job_id": "job_test", "spec": spec,
        "model_path": str(model or spec["model"]["path"]),
        "dataset_path": str(dataset or spec["dataset"]["path"]),
        "resolved": {"micro_batch_size": t["micro_batch_size"], "gradient_accumulation_steps":
                     t["gradient_accumulation_steps"], "gradient_checkpointing": t["gradient_checkpointing"],
                     "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "none", "num_gpus": 1,
                     "precision": t["precision"]},
        "deepspeed_config": config or ds_config(lr=t["learning_rate"], mbs=t["micro_batch_size"],
                                                ga=t["gradient_accumulation_steps"]),
        "device": "cpu",
    }
    (job_dir / "run.json").write_text(json.dumps(run, indent=2))
    return job_dir


def cpu_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": TORCH_EXT, "RANK": "0", "WORLD_SIZE": "1",
                "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": str(REPO)})
    env.update(extra)
    return env


def run_module(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=cpu_env(), text=True,
                          capture_output=True, timeout=timeout)


def run_train(job_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_module("worker.train", "--job-dir", str(job_dir), timeout=timeout)


def read_progress(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def alpaca_file(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "data" / "alpaca.jsonl", "alpaca", n=48)
