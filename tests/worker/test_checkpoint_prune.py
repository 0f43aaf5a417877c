"""training.save_total_limit: the newest checkpoints stay, and none an evaluation may still read goes."""

from __future__ import annotations

import json
from pathlib import Path

from worker._trainlib.checkpoint import STATE_FILE, complete_steps, latest_complete, prune


def _save(root: Path, step: int) -> None:
    folder = root / f"step-{step}"
    folder.mkdir(parents=True)
    (folder / STATE_FILE).write_text(json.dumps({"step": step}))
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * 1024)


def test_the_newest_are_kept_and_the_rest_removed(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (10, 20, 30, 40):
        _save(root, step)
    (root / ".tmp-step-50").mkdir()  # a save under way is not a checkpoint
    assert prune(root, 2) == [10, 20]
    assert complete_steps(root) == [30, 40]
    found = latest_complete(root)
    assert found is not None and found.step == 40
    assert (root / ".tmp-step-50").is_dir()


def test_a_checkpoint_waiting_for_its_evaluation_is_kept(tmp_path: Path) -> None:
    root, evals = tmp_path / "checkpoints", tmp_path / "eval"
    evals.mkdir()
    for step in (10, 20, 30, 40):
        _save(root, step)
    assert prune(root, 1, evals) == []  # nothing evaluated yet: every one may still be read
    (evals / "step-20.json").write_text("{}")
    assert prune(root, 1, evals) == [10, 20]  # older than an evaluated one: never read again
    assert complete_steps(root) == [30, 40]
