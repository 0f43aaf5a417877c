"""Pause with two ranks: both stop at the same step boundary after one collective save, and the
run resumes from that checkpoint where it stopped (the worker's pause, without the worker)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from unittest import mock

from tests.worker_train import planned
from tests.worker_train.planned import Mode, spec_of
from worker import launcher
from worker._trainlib.checkpoint import complete_steps
from worker._trainlib.runfile import EXIT_PAUSED, PAUSE_FILE


def _start(job_dir: Path, cfg: object) -> launcher.ProcessGroup:
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    with mock.patch.dict(os.environ, env):
        return launcher.start_training(job_dir, planned.cpu_grant(2), cfg,  # type: ignore[arg-type]
                                       launcher.RunId("job_test", 1, "tests"))


def _steps(job_dir: Path) -> list[int]:
    return [int(e["step"]) for e in planned.progress(job_dir) if e["type"] == "progress"]


def test_two_ranks_pause_at_one_step_and_resume_from_it(tiny_model: Path, alpaca_file: Path,
                                                        tmp_path: Path) -> None:
    mode = Mode(2, "fp32", "adamw", "lora", 5e-3, mbs=2, cards=2, steps=10_000)
    job_dir, cfg = tmp_path / "job", planned.settings(tmp_path / "data", train_module="worker.train")
    planned.write_planned_run(job_dir, spec_of(mode, tiny_model, alpaca_file), 2, cfg)
    group = _start(job_dir, cfg)
    try:
        deadline = time.monotonic() + 300
        while len(_steps(job_dir)) < 2:
            assert group.poll() is None and time.monotonic() < deadline, planned.log_tail(job_dir)
            time.sleep(0.2)
        (job_dir / PAUSE_FILE).touch()  # what the worker's pause does
        while (code := group.poll()) is None:
            assert time.monotonic() < deadline, planned.log_tail(job_dir)
            time.sleep(0.2)
    finally:
        launcher.terminate(group, 5)
    assert code == EXIT_PAUSED, planned.log_tail(job_dir)
    [paused] = [e for e in planned.progress(job_dir) if e["type"] == "paused"]
    step = int(paused["step"])
    assert _steps(job_dir)[-1] == step and complete_steps(job_dir / "checkpoints")[-1] == step

    (job_dir / PAUSE_FILE).unlink()  # the worker clears it when it starts the run again
    run = json.loads((job_dir / "run.json").read_text())
    run["spec"]["training"]["max_steps"] = step + 2
    (job_dir / "run.json").write_text(json.dumps(run))
    assert planned.train(job_dir, 2, cfg) == 0, planned.log_tail(job_dir)  # type: ignore[arg-type]
    starts = [e for e in planned.progress(job_dir) if e["type"] == "start"]
    assert starts[-1]["start_step"] == step and starts[-1]["resumed_from"].endswith(f"step-{step}")
    assert starts[-1]["world_size"] == 2
    assert _steps(job_dir)[-2:] == [step + 1, step + 2]
    assert planned.progress(job_dir)[-1]["type"] == "done"
