"""The training and evaluation processes, for real: DeepSpeed ZeRO-3 + CPU optimizer offload on the CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

from tests.tinydata import write_dataset
from tests.worker_train.conftest import (
    REPO,
    TORCH_EXT,
    cpu_env,
    make_spec,
    read_progress,
    run_module,
    run_train,
    write_run,
)

pytestmark = pytest.mark.slow


def _steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "progress"]


def _done(job: Path, result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr[-4000:]
    assert not (job / "failure.json").exists()
    events = read_progress(job)
    assert events[-1]["type"] == "done", events[-3:]
    return events[-1]


def _failure(job: Path, result: subprocess.CompletedProcess[str], code: int) -> dict[str, Any]:
    assert result.returncode == code, result.stderr[-4000:]
    return json.loads((job / "failure.json").read_text())


def _evaluate(job: Path, checkpoint: Path) -> dict[str, Any]:
    result = run_module("worker.evaluate", "--job-dir", str(job), "--checkpoint", str(checkpoint))
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads((job / "eval" / f"{checkpoint.name}.json").read_text())


def _set_max_steps(job: Path, max_steps: int) -> None:
    run = json.loads((job / "run.json").read_text())
    run["spec"]["training"]["max_steps"] = max_steps
    (job / "run.json").write_text(json.dumps(run))


def test_full_fine_tune_trains_saves_a_model_and_evaluates_elsewhere(tmp_path: Path, tiny_model: Path,
                                                                     alpaca_file: Path) -> None:
    job = write_run(tmp_path / "job", make_spec(tiny_model, alpaca_file, method="full", max_steps=10,
                                                save_steps=5, lr=3e-3))
    done = _done(job, run_train(job))
    events = read_progress(job)
    steps = _steps(events)
    assert [s["step"] for s in steps] == list(range(1, 11))
    assert mean(s["loss"] for s in steps[-3:]) < mean(s["loss"] for s in steps[:3]) - 0.5
    assert {"lr", "epoch", "tokens_per_second", "samples_per_second", "host_rss_bytes", "eta_seconds",
            "peak_gpu_bytes", "host_cpu_percent"} <= set(steps[0])
    assert [e["step"] for e in events if e["type"] == "checkpoint"] == [5, 10]
    final = Path(done["final_path"])
    assert final == job / "checkpoints" / "step-10" and done["host_peak_rss_bytes"] > 0

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(final), local_files_only=True)
    assert model.num_parameters() > 100_000  # the whole model, consolidated from the ZeRO-3 partitions
    assert (final / "tokenizer.json").is_file() and (final / "ds").is_dir()

    report = _evaluate(job, final)
    assert report["pid"] != events[0]["pid"] and report["step"] == 10
    assert report["num_rows"] == 5 and abs(report["eval_loss"] - steps[-1]["loss"]) < 1.0
    assert report["perplexity"] == pytest.approx(2.718281828 ** report["eval_loss"], rel=1e-6)
    assert len(report["samples"]) == 2 and report["samples"][0]["reference"].count(" ") == 2


def test_lora_resumes_from_the_newest_checkpoint_and_continues_the_data_order(
        tmp_path: Path, tiny_model: Path, alpaca_file: Path) -> None:
    spec = make_spec(tiny_model, alpaca_file, max_steps=6, save_steps=100)
    reference = write_run(tmp_path / "reference", spec)
    _done(reference, run_train(reference))
    uninterrupted = [s["loss"] for s in _steps(read_progress(reference))]

    job = write_run(tmp_path / "job", make_spec(tiny_model, alpaca_file, max_steps=4, save_steps=2))
    _done(job, run_train(job))
    first_pid = read_progress(job)[0]["pid"]
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["step-2", "step-4"]
    _set_max_steps(job, 6)
    done = _done(job, run_train(job))

    events = read_progress(job)
    starts = [e for e in events if e["type"] == "start"]
    assert starts[1]["start_step"] == 4 and starts[1]["resumed_from"].endswith("step-4")
    assert [s["step"] for s in _steps(events)] == [1, 2, 3, 4, 5, 6]
    assert done["step"] == 6 and done["final_path"].endswith("step-6")
    resumed = [s["loss"] for s in _steps(events)]
    # same data, same optimizer state: the resumed steps repeat the uninterrupted run's losses
    assert resumed == pytest.approx(uninterrupted, abs=2e-3)
    assert mean(uninterrupted[-2:]) < mean(uninterrupted[:2])

    final = Path(done["final_path"])
    assert {"adapter_model.safetensors", "adapter_config.json", "trainer_state.json"} <= {
        p.name for p in final.iterdir()}
    assert json.loads((final / "trainer_state.json").read_text())["step"] == 6

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), local_files_only=True)
    model = PeftModel.from_pretrained(base, str(final))
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(float(p.abs().sum()) > 0 for p in lora_b)  # trained, not the zero init

    report = _evaluate(job, final)
    assert report["pid"] not in (first_pid, starts[1]["pid"])
    assert report["eval_loss"] is not None and 0 < report["eval_loss"] < 20


def test_sigterm_stops_promptly_without_a_partial_checkpoint(tmp_path: Path, tiny_model: Path,
                                                             alpaca_file: Path) -> None:
    job = write_run(tmp_path / "job", make_spec(tiny_model, alpaca_file, method="full", max_steps=100_000,
                                                save_steps=1))
    log = (tmp_path / "stderr.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "worker.train", "--job-dir", str(job)], cwd=REPO,
                            env=cpu_env(), stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 240
        while not any(e["type"] == "checkpoint" for e in read_progress(job)):
            alive = proc.poll() is None and time.monotonic() < deadline
            assert alive, (tmp_path / "stderr.log").read_text()[-4000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert proc.wait(timeout=30) == 143
        assert time.monotonic() - sent < 15
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert read_progress(job)[-1]["type"] == "stopped"
    names = [p.name for p in (job / "checkpoints").iterdir()]
    assert names and all(n.startswith("step-") for n in names)
    for name in names:
        assert (job / "checkpoints" / name / "trainer_state.json").is_file()
    assert not (job / "failure.json").exists()


# ------------------------------------------------------------------ failures before any training


def test_malformed_dataset_is_a_user_error(tmp_path: Path, tiny_model: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": \n')
    job = write_run(tmp_path / "job", make_spec(tiny_model, bad))
    failure = _failure(job, run_train(job), 2)
    assert (failure["kind"], failure["reason"]) == ("user_error", "bad_dataset")
    assert "line 2" in failure["message"]


def test_missing_model_folder_is_a_user_error(tmp_path: Path, alpaca_file: Path) -> None:
    job = write_run(tmp_path / "job", make_spec(tmp_path / "no-such-model", alpaca_file))
    failure = _failure(job, run_train(job), 2)
    assert (failure["kind"], failure["reason"]) == ("user_error", "bad_model")


def test_model_without_tokenizer_is_a_user_error(tmp_path: Path, tiny_model: Path, alpaca_file: Path) -> None:
    model = tmp_path / "weights-only"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        os.symlink(tiny_model / name, model / name)
    job = write_run(tmp_path / "job", make_spec(model, alpaca_file))
    failure = _failure(job, run_train(job), 2)
    assert (failure["kind"], failure["reason"]) == ("user_error", "missing_tokenizer")


def test_qlora_without_a_gpu_is_refused(tmp_path: Path, tiny_model: Path, alpaca_file: Path) -> None:
    job = write_run(tmp_path / "job", make_spec(tiny_model, alpaca_file, method="qlora"))
    failure = _failure(job, run_train(job), 2)
    assert (failure["kind"], failure["reason"]) == ("user_error", "qlora_unavailable")


def test_declared_format_mismatch_is_bad_dataset(tmp_path: Path, tiny_model: Path) -> None:
    data = write_dataset(tmp_path / "text.jsonl", "text", n=8)
    job = write_run(tmp_path / "job", make_spec(tiny_model, data, fmt="alpaca"))
    failure = _failure(job, run_train(job), 2)
    assert failure["reason"] == "bad_dataset" and "dataset.format" in failure["message"]


def test_evaluate_failure_is_reported_not_raised(tmp_path: Path, tiny_model: Path, alpaca_file: Path) -> None:
    job = write_run(tmp_path / "job", make_spec(tiny_model, alpaca_file))
    out = tmp_path / "eval.json"
    result = run_module("worker.evaluate", "--job-dir", str(job), "--checkpoint", str(job / "nope"),
                        "--out", str(out))
    assert result.returncode == 2
    report = json.loads(out.read_text())
    assert (report["status"], report["reason"]) == ("failed", "bad_checkpoint")


def test_runs_under_the_deepspeed_launcher(tmp_path: Path, tiny_model: Path) -> None:
    """``deepspeed --module worker.train`` (it appends --local_rank) works on the CPU accelerator too."""
    data = write_dataset(tmp_path / "sharegpt.jsonl", "sharegpt", n=24)
    job = write_run(tmp_path / "job", make_spec(tiny_model, data, max_steps=2, save_steps=100))
    env = cpu_env()
    port = env.pop("MASTER_PORT")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        env.pop(key)
    result = subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner", "--master_port", port,
                             "--module", "worker.train", "--job-dir", str(job)],
                            cwd=REPO, env=env, text=True, capture_output=True, timeout=300)
    done = _done(job, result)
    assert done["step"] == 2 and (Path(done["final_path"]) / "adapter_model.safetensors").is_file()


PROBE = """
import json, sys
from pathlib import Path
from worker._trainlib.runfile import load_run
from worker.train import Trainer

trainer = Trainer(load_run(Path(sys.argv[1])))
trainer.preflight()
trainer.load_data()
trainer.build_engine()
trainer.plan_steps()
module = trainer.engine.module
# a module inside each decoder layer: a checkpointed layer runs its body again in backward
layers = [m for m in module.modules() if type(m).__name__.endswith("MLP")]
calls = []
for layer in layers:
    layer.register_forward_pre_hook(lambda *_: calls.append(1))  # recomputation may stop mid-module
dropouts = [m for m in module.modules() if type(m).__name__ == "Dropout" and m.p > 0]
trainer.train_step()
print(json.dumps({"layers": len(layers), "layer_forwards": len(calls),
                  "training": all(m.training for m in module.modules()),
                  "dropouts_in_train_mode": all(m.training for m in dropouts), "dropouts": len(dropouts)}))
"""


@pytest.mark.parametrize("checkpointing", [True, False])
def test_steps_run_in_train_mode_so_checkpointing_recomputes_and_dropout_applies(
        tmp_path: Path, tiny_model: Path, alpaca_file: Path, checkpointing: bool) -> None:
    # from_pretrained hands back a model in eval mode, where transformers skips gradient checkpointing
    # (every activation stays in memory) and LoRA dropout is off
    spec = make_spec(tiny_model, alpaca_file, max_steps=2)
    spec["lora"]["dropout"] = 0.1
    spec["training"]["gradient_checkpointing"] = checkpointing
    job = write_run(tmp_path / "job", spec)
    result = subprocess.run([sys.executable, "-c", PROBE, str(job)], cwd=REPO, env=cpu_env(), text=True,
                            capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["training"] is True
    assert probe["dropouts"] > 0 and probe["dropouts_in_train_mode"]
    # one micro-batch: each layer's MLP runs forward once, and again in backward when checkpointed
    assert probe["layers"] > 0
    assert probe["layer_forwards"] == probe["layers"] * (2 if checkpointing else 1)


def test_a_build_lock_left_by_a_killed_run_does_not_stall_the_next_run(tmp_path: Path, tiny_model: Path,
                                                                       alpaca_file: Path) -> None:
    """A run killed while torch held an op's build lock (a cancel's SIGKILL during start-up) leaves
    the lock file behind; torch would make every later run wait on it forever."""
    root = Path(TORCH_EXT)
    locks = [root / op / "lock" for op in ("deepspeed_shm_comm", "cpu_adam")]  # the ops a CPU run loads
    for lock in locks:
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.touch()
        os.utime(lock, (time.time() - 3600, time.time() - 3600))
    job = write_run(tmp_path / "job", make_spec(tiny_model, alpaca_file, max_steps=2))
    result = run_train(job, timeout=240)
    _done(job, result)
    assert not any(lock.exists() for lock in locks)
    assert "removed a stale build lock" in result.stdout + result.stderr


def test_a_run_waiting_for_another_processs_op_build_says_so(tmp_path: Path, tiny_model: Path,
                                                             alpaca_file: Path) -> None:
    """torch builds an op under its lock; a run that needs the op meanwhile waits, and says for what."""
    lock = Path(TORCH_EXT) / "cpu_adam" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    # another process's build: it holds the lock, then removes it as torch does when the build ends
    builder = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], "
                                "os.O_CREAT | os.O_EXCL); print('held', flush=True); time.sleep(12); "
                                "os.unlink(sys.argv[1])", str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert builder.stdout is not None and builder.stdout.readline().strip() == "held"
        job = write_run(tmp_path / "job", make_spec(tiny_model, alpaca_file, max_steps=1))
        _done(job, run_train(job, timeout=240))
    finally:
        builder.kill()
        builder.wait()
        lock.unlink(missing_ok=True)
    builds = [e for e in read_progress(job) if e["type"] == "op_build"]
    assert builds and builds[0]["op"] == "cpu_adam" and builds[0]["waiting"] is True
    assert len({b["op"] for b in builds}) == len(builds)  # each op once
