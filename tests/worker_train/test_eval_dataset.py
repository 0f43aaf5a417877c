"""``eval.dataset``: the evaluation rows come from their own file, and every training row trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tinydata import write_dataset
from tests.worker_train.conftest import make_spec, write_run
from worker._trainlib.data import read_eval_split
from worker._trainlib.runfile import JobFailure, load_run
from worker.train import Trainer


def _trainer(job: Path, eval_path: Path | None) -> Trainer:
    run = json.loads((job / "run.json").read_text())
    run["eval_dataset_path"] = str(eval_path) if eval_path else ""
    (job / "run.json").write_text(json.dumps(run))
    return Trainer(load_run(job))


def test_the_eval_rows_are_the_eval_dataset_and_no_training_row_is_held_out(
        tmp_path: Path, tiny_model: Path, alpaca_file: Path) -> None:
    held = write_dataset(tmp_path / "data" / "held.jsonl", "sharegpt", n=7, seed=3)
    spec = make_spec(tiny_model, alpaca_file)
    del spec["dataset"]["eval_fraction"]
    spec["eval"]["dataset"] = {"path": str(held), "format": "sharegpt"}
    trainer = _trainer(write_run(tmp_path / "job", spec), held)
    assert trainer.spec.dataset is not None and trainer.spec.dataset.eval_fraction == 0.0
    trainer.load_data()
    assert trainer.eval_rows == trainer.data_report["eval_rows"] == 7
    assert trainer.data_report["rows"] == 48  # all of the training file trains
    rows = read_eval_split(trainer.run.eval_split_path)
    assert [fmt for fmt, _ in rows] == ["sharegpt"] * 7  # each row keeps its own format for the evaluator
    first = json.loads(held.read_text().splitlines()[0])
    assert rows[0][1]["messages"][-1]["content"] == first["conversations"][-1]["value"]


def test_without_eval_dataset_a_share_of_the_training_file_is_held_out(
        tmp_path: Path, tiny_model: Path, alpaca_file: Path) -> None:
    trainer = _trainer(write_run(tmp_path / "job", make_spec(tiny_model, alpaca_file)), None)
    trainer.load_data()
    assert trainer.eval_rows == 5 and trainer.data_report["rows"] == 43


def test_a_bad_eval_dataset_is_the_users_error_naming_it(tmp_path: Path, tiny_model: Path,
                                                         alpaca_file: Path) -> None:
    broken = tmp_path / "data" / "broken.jsonl"
    broken.write_text('{"instruction": "a"}\nnot json\n')
    spec = make_spec(tiny_model, alpaca_file)
    del spec["dataset"]["eval_fraction"]
    spec["eval"]["dataset"] = {"path": str(broken)}
    trainer = _trainer(write_run(tmp_path / "job", spec), broken)
    with pytest.raises(JobFailure) as err:
        trainer.load_data()
    assert err.value.reason == "bad_dataset" and err.value.message.startswith("eval.dataset: ")
