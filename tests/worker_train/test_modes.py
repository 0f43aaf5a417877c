"""Real training in every mode the service offers, on the CPU with the tiny model.

Each run is planned by the planner, its ``run.json`` written by the worker's launcher and its ranks
started by it (``tests/worker_train/planned.py``); the training is ``worker.train``'s. Every run checks:

- the loss falls on the learnable pattern of ``tests/tinydata.py``: the mean of the last three
  steps' losses is at most ``LOSS_FACTOR[method]`` times the mean of the first three (adapters on
  every projection and on the output layer);
- the final checkpoint reloads (transformers, plus peft for an adapter) to the model that was
  trained: its logits on the first training example equal the trained engine's within
  ``LOGITS_ATOL[precision]``, while training moved them by far more than that.

ZeRO-2 fp32 full fine-tuning with SGD also runs with gradient accumulation 2 and on two ranks over
gloo: the same four rows make each optimizer step (micro-batches 2 x 2, or 2 per rank), so every
step's loss, the accumulated or the all-reduced one, equals the reference run's (4 rows at once)
within ``SAME_STEP_ATOL``. SGD's update is linear in the gradient, so a micro-batch weighted wrongly
shows in the next step's loss (Adam's first updates are nearly the gradient's sign: scale-free, and
they turn rounding noise into whole steps). The tiny dataset's answers carry 5 or 6 target tokens,
so micro-batches of the same size hold different numbers of targets: each must weigh by its targets,
not alike, for the step to be the batch's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

from tests.tinydata import write_dataset
from tests.worker_train import planned
from tests.worker_train.planned import Mode, spec_of
from tests.worker_train.probe_train import PROBE_FILE

pytestmark = pytest.mark.slow

# a random-init base learns slower through adapters than through all its weights
LOSS_FACTOR = {"full": 0.8, "lora": 0.9}
LOGITS_ATOL = {"fp32": 1e-4, "bf16": 2e-2}
# the trained model's logits differ from the untrained one's by at least this many tolerances
MOVED_OVER_ATOL = 20
SAME_STEP_ATOL = 2e-3


MODES = [
    Mode(0, "fp32", "adamw", "full", 5e-3),
    Mode(1, "bf16", "lion", "lora", 3e-3),
    Mode(2, "bf16", "sgd", "full", 0.2),
    Mode(3, "bf16", "adamw", "lora", 2e-2),
]
REFERENCE = Mode(2, "fp32", "sgd", "full", 0.15)


@dataclass(frozen=True)
class Trained:
    job_dir: Path
    run: dict[str, Any]
    losses: list[float]
    final: Path


def run_mode(mode: Mode, model: Path, data: Path, base: Path) -> Trained:
    job_dir = base / mode.id / f"mbs{mode.mbs}-ga{mode.ga}-ranks{mode.cards}"
    cfg = planned.settings(base / "data")
    run = planned.write_planned_run(job_dir, spec_of(mode, model, data), mode.cards, cfg)
    code = planned.train(job_dir, mode.cards, cfg)
    assert code == 0, planned.log_tail(job_dir)
    done = planned.progress(job_dir)[-1]
    assert done["type"] == "done", planned.log_tail(job_dir)
    return Trained(job_dir, run, planned.losses(job_dir), Path(done["final_path"]))


def logits_of(checkpoint: Path | None, base_model: Path, method: str, precision: str, ids: Any) -> Any:
    """The logits of ``checkpoint`` loaded the way users load it (the base model where it is None)."""
    import torch
    from transformers import AutoModelForCausalLM

    from worker._trainlib.modeling import torch_dtype

    dtype = torch_dtype(precision, "cpu")
    if checkpoint is not None and method == "full":
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype, local_files_only=True)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=dtype, local_files_only=True)
        if checkpoint is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(checkpoint))
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def check_trained(trained: Trained, mode: Mode, model: Path) -> None:
    import torch

    losses = trained.losses
    assert len(losses) == mode.steps
    resolved = trained.run["resolved"]
    assert (resolved["zero_stage"], resolved["precision"], resolved["num_gpus"]) == (
        mode.stage, mode.precision, mode.cards)
    probe = torch.load(trained.job_dir / PROBE_FILE)
    torch.set_num_threads(1)  # the training ranks' thread count: the same reductions, the same sums
    reloaded = logits_of(trained.final, model, mode.method, mode.precision, probe["input_ids"])
    untrained = logits_of(None, model, mode.method, mode.precision, probe["input_ids"])
    atol = LOGITS_ATOL[mode.precision]
    assert (reloaded - probe["logits"]).abs().max().item() <= atol
    assert (untrained - probe["logits"]).abs().max().item() > MOVED_OVER_ATOL * atol
    assert mean(losses[-3:]) <= LOSS_FACTOR[mode.method] * mean(losses[:3]), losses


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("modes-data") / "alpaca.jsonl", "alpaca", n=48)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.id)
def test_each_mode_trains_and_its_checkpoint_reloads(mode: Mode, tiny_model: Path, data: Path,
                                                      tmp_path: Path) -> None:
    trained = run_mode(mode, tiny_model, data, tmp_path)
    check_trained(trained, mode, tiny_model)
    ds = trained.run["deepspeed_config"]
    assert ds["zero_optimization"]["stage"] == mode.stage
    assert ds["bf16"]["enabled"] is (mode.precision == "bf16")


@pytest.fixture(scope="module")
def reference(tiny_model: Path, data: Path, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    trained = run_mode(REFERENCE, tiny_model, data, tmp_path_factory.mktemp("reference"))
    check_trained(trained, REFERENCE, tiny_model)
    return trained


@pytest.mark.parametrize(("mbs", "ga", "cards"), [(2, 2, 1), (2, 1, 2)], ids=["accumulation-2", "two-ranks"])
def test_an_accumulated_or_all_reduced_step_equals_the_same_batch_at_once(
        mbs: int, ga: int, cards: int, reference: Trained, tiny_model: Path, data: Path,
        tmp_path: Path) -> None:
    mode = Mode(REFERENCE.stage, REFERENCE.precision, REFERENCE.optimizer, REFERENCE.method, REFERENCE.lr,
                mbs=mbs, ga=ga, cards=cards)
    trained = run_mode(mode, tiny_model, data, tmp_path)
    check_trained(trained, mode, tiny_model)
    ds = trained.run["deepspeed_config"]
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (mbs, ga)
    assert planned.progress(trained.job_dir)[0]["world_size"] == cards
    assert trained.losses == pytest.approx(reference.losses, abs=SAME_STEP_ATOL)
