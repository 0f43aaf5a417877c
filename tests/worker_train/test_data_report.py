"""A real training run accounts for every row: rows, tokens, truncated and dropped rows in its start record;
more dropped than dataset.max_dropped_fraction is a user_error with the counts; packed and length-grouped
runs both train."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tinydata import alpaca_rows, write_jsonl
from tests.worker_train.conftest import make_spec, read_progress, run_train, write_run


def _dataset(tmp_path: Path, long_rows: int) -> Path:
    rows = alpaca_rows(40)
    rows += [{"instruction": "Repeat the word: apple " * 40, "input": "", "output": "apple"}] * long_rows
    return write_jsonl(tmp_path / "data.jsonl", rows)


def _spec(tmp_path: Path, long_rows: int, **dataset: object) -> dict:
    spec = make_spec(Path(tmp_path / "unused"), _dataset(tmp_path, long_rows), max_steps=4, eval_fraction=0.0)
    spec["dataset"].update(dataset)
    return spec


def test_too_many_dropped_rows_is_a_user_error_naming_the_counts(tmp_path: Path, tiny_model: Path) -> None:
    spec = _spec(tmp_path, long_rows=3)
    spec["model"]["path"] = str(tiny_model)
    job = write_run(tmp_path / "job", spec)
    result = run_train(job)
    assert result.returncode == 2, result.stderr[-2000:]
    failure = json.loads((job / "failure.json").read_text())
    assert failure["reason"] == "rows_dropped"
    assert "3 of 43 rows (7.0%)" in failure["message"] and "1.0%" in failure["message"]


def test_a_run_reports_its_rows_and_tokens_packed_and_unpacked(tmp_path: Path, tiny_model: Path) -> None:
    reports = {}
    for packing in (True, False):
        spec = _spec(tmp_path, long_rows=3, max_dropped_fraction=0.1)
        spec["model"]["path"] = str(tiny_model)
        spec["training"]["packing"] = packing
        job = write_run(tmp_path / f"job-{packing}", spec)
        result = run_train(job)
        assert result.returncode == 0, result.stderr[-3000:]
        events = read_progress(job)
        start = next(e for e in events if e["type"] == "start")
        steps = [e for e in events if e["type"] == "progress"]
        assert [s["step"] for s in steps] == [1, 2, 3, 4] and all(s["loss"] > 0 for s in steps)
        reports[packing] = start
    packed, unpacked = reports[True], reports[False]
    data = packed["data"]
    assert data == unpacked["data"]
    assert (data["rows"], data["kept_rows"], data["dropped_rows"]) == (43, 40, 3)
    assert data["dropped"] == {"no_answer_within_seq_len": 3} and data["dropped_row_numbers"] == [41, 42, 43]
    assert data["tokens_per_row"]["max"] > 64 and data["truncated_rows"] == 0
    assert 0 < data["trained_tokens"] < data["tokens"] and packed["train_rows"] == 40
    # 40 rows of 20-30 tokens in rows of 64: more than one example a row, and never two rows each
    # less than half full (what first-fit packing guarantees: under twice the fewest rows possible)
    assert packed["packed_rows"] < 40 and packed["packed_rows"] <= 2 * (data["tokens"] // 64 + 1)
    assert unpacked["packed_rows"] is None
    assert data["packed_rows"] == packed["packed_rows"]  # the report packs as the trainer does


def test_tunebox_dataset_inspect_reports_what_training_would_make_of_a_file(
    tmp_path: Path, tiny_model: Path
) -> None:
    import subprocess
    import sys

    data = _dataset(tmp_path, long_rows=3)
    cli = [
        sys.executable,
        "-m",
        "tunebox.cli",
        "dataset",
        "inspect",
        str(data),
        "--model",
        str(tiny_model),
        "--seq-len",
        "64",
    ]
    shown = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "rows            43  (kept 40)" in shown.stdout and "packed rows     " in shown.stdout
    assert (
        "dropped rows    3  (3 no_answer_within_seq_len)" in shown.stdout
        and "rows 41, 42, 43" in shown.stdout
    )
    assert f"\u27e6{alpaca_rows(1)[0]['output']}</s>\n\u27e7" in shown.stdout
    report = json.loads(subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=120).stdout)
    assert (
        report["format"] == "alpaca" and report["dropped_rows"] == 3 and report["tokens_per_row"]["max"] > 64
    )
    example = report["example"]
    spans = [example["text"][s:e] for s, e in example["trained_spans"]]
    assert len(spans) == 1 and spans[0].startswith(alpaca_rows(1)[0]["output"])
    bad = subprocess.run(
        [*cli[:5], str(tmp_path / "absent.jsonl"), *cli[6:]], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "no such file" in bad.stderr
