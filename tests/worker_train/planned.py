"""Training runs as the worker starts them: the planner's plan, ``run.json`` from the launcher, and
the training ranks spawned by ``launcher.start_training`` on the CPU standing in for the cards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from planner import plan
from planner.spec import HardwareSpec
from store.models import Job
from tests.worker_train.conftest import LORA_TARGETS, REPO, TORCH_EXT
from tunebox.settings import Settings
from worker import launcher
from worker.leasing import Grant

GIB = 2**30
# a box of CPU stand-in cards, as TUNEBOX_GPU_COUNT / TUNEBOX_GPU_MEMORY_BYTES describe one
CARD_BYTES = 24 * GIB
HOST_BYTES = 16 * GIB


@dataclass(frozen=True)
class Mode:
    stage: int
    precision: str
    optimizer: str
    method: str
    lr: float
    offload: str = "none"
    mbs: int = 4
    ga: int = 1
    cards: int = 1
    steps: int = 12
    eval: str = "none"

    @property
    def id(self) -> str:
        offload = "-offload" if self.offload != "none" else ""
        return f"zero{self.stage}-{self.precision}-{self.optimizer}-{self.method}{offload}"


def spec_of(mode: Mode, model: Path, data: Path) -> dict[str, Any]:
    return {
        "name": mode.id, "model": {"path": str(model)},
        "dataset": {"path": str(data), "format": "alpaca", "eval_fraction": 0.1},
        "method": mode.method,
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": [*LORA_TARGETS, "lm_head"]},
        "training": {"max_steps": mode.steps, "epochs": None, "learning_rate": mode.lr,
                     "lr_scheduler": "constant", "warmup_ratio": 0.0, "micro_batch_size": mode.mbs,
                     "gradient_accumulation_steps": mode.ga, "seq_len": 64, "gradient_checkpointing": False,
                     "precision": mode.precision, "optimizer": mode.optimizer, "save_steps": mode.steps,
                     # one example a row: the compared batch shapes then see the same rows in the same
                     # order (packed rows' number follows the lengths and need not divide into them)
                     "packing": False, "seed": 7},
        "resources": {"num_gpus": mode.cards, "zero_stage": mode.stage, "offload_optimizer": mode.offload,
                      "offload_param": "none"},
        "eval": {"when": mode.eval, "max_new_tokens": 4, "batch_size": 2, "num_samples": 1},
    }


def cpu_grant(cards: int) -> Grant:
    """What the leasing hands a job on a box whose cards are the CPU (inventory uuids ``cpu-N``)."""
    return Grant(gpu_ids=tuple(range(1, cards + 1)), indices=tuple(range(cards)),
                 uuids=tuple(f"cpu-{i}" for i in range(cards)), exclusive=True)


def settings(data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"data_dir": data_dir, "torch_extensions_dir": Path(TORCH_EXT),
                              "train_module": "tests.worker_train.probe_train", "gpu_count": 2,
                              "gpu_memory_bytes": CARD_BYTES, "host_memory_bytes": HOST_BYTES}
    values.update(overrides)
    return Settings(**values)


def planned_job(spec: dict[str, Any], cards: int, job_id: str = "job_test") -> Job:
    """A job row as the API stores it: the spec and the planner's plan for this box."""
    hardware = HardwareSpec(gpu_count=cards, gpu_memory_bytes=CARD_BYTES, host_memory_bytes=HOST_BYTES)
    made = plan(spec, hardware=hardware)
    assert made.fits, made.model_dump(mode="json").get("warnings")
    return Job(id=job_id, spec=spec, plan=made.model_dump(mode="json"), num_gpus=made.num_gpus)


def write_planned_run(job_dir: Path, spec: dict[str, Any], cards: int, cfg: Settings,
                      job_id: str = "job_test") -> dict[str, Any]:
    """``job_dir/run.json`` exactly as the worker writes it for ``spec`` on ``cards`` stand-in cards."""
    job = planned_job(spec, cards, job_id)
    run = launcher.build_run_file(None, job, cpu_grant(cards), cfg)  # type: ignore[arg-type]
    launcher.write_run_file(job_dir, run)
    return run


def train(job_dir: Path, cards: int, cfg: Settings, timeout: float = 420) -> int:
    """Start the ranks as the worker does and wait for them; returns the first failing exit code."""
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    with mock.patch.dict(os.environ, env):
        group = launcher.start_training(job_dir, cpu_grant(cards), cfg,
                                        launcher.RunId("job_test", 1, "tests"))
    deadline = time.monotonic() + timeout
    try:
        while (code := group.poll()) is None:
            assert time.monotonic() < deadline, f"still training after {timeout}s: {log_tail(job_dir)}"
            time.sleep(0.2)
    finally:
        launcher.terminate(group, 5)
    return code


def gpu_grant(uuids: list[str]) -> Grant:
    """What the leasing hands a job on a box of real cards with these NVML uuids."""
    return Grant(gpu_ids=tuple(range(1, len(uuids) + 1)), indices=tuple(range(len(uuids))),
                 uuids=tuple(uuids), exclusive=True)


def nvml_uuids() -> list[str]:
    """The box's NVIDIA cards as NVML lists them; skips the test where there are none."""
    import pytest

    from tunebox import gpus

    found = gpus._nvml_inventory()
    if not found:
        pytest.skip("no NVIDIA GPU visible to NVML")
    return [g.uuid for g in found]


def train_alone(job_dir: Path, grant: Grant, spec: dict[str, Any], *,
                env_changes: dict[str, str] | None = None, timeout: float = 300, **run_changes: Any) -> int:
    """One training rank with the run file and environment the worker gives it for ``grant``."""
    cfg = settings(job_dir.parent / "data")
    run = launcher.build_run_file(None, planned_job(spec, len(grant.uuids)), grant, cfg)  # type: ignore[arg-type]
    launcher.write_run_file(job_dir, {**run, **run_changes})
    env = launcher.rank_env(launcher.base_env(grant, cfg, launcher.RunId("job_test", 1, "tests"), "train"),
                            0, 1, launcher.free_port())
    env.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env_changes or {})})
    done = subprocess.run([sys.executable, "-m", "worker.train", "--job-dir", str(job_dir)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode


def log_tail(job_dir: Path, chars: int = 4000) -> str:
    path = job_dir / "train.log"
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def progress(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def losses(job_dir: Path) -> list[float]:
    return [float(e["loss"]) for e in progress(job_dir) if e["type"] == "progress"]
