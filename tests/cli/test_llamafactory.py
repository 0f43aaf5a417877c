"""``tunebox submit --from llamafactory FILE.yaml`` against a live server (Postgres)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from store.db import session_scope
from store.models import Job
from tests.api.conftest import Env
from tunebox.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "llamafactory"


def _config(tmp_path: Path, roots: tuple[Path, Path], **changes: object) -> str:
    """LLaMA-Factory's DeepSpeed LoRA example on this box's model and dataset, its DeepSpeed file beside."""
    config = yaml.safe_load((DATA / "qwen3_lora_sft_ds3.yaml").read_text())
    config.update(
        model_name_or_path="small",
        dataset="train.jsonl",
        dataset_dir=str(roots[1]),
        cutoff_len=512,
        max_steps=10,
        **changes,
    )
    shutil.copy(DATA / "ds_z3_config.json", tmp_path / "ds_z3_config.json")
    path = tmp_path / "lf.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_submit_from_llamafactory_prints_the_spec_and_what_it_does_not_take(
    server: Env, roots: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["submit", "--from", "llamafactory", _config(tmp_path, roots)]) == 0
    out = capsys.readouterr()
    job_id = out.out.strip()
    assert job_id.startswith("job_")
    printed = yaml.safe_load(out.err.split("# not taken from")[0])
    assert printed["lora"] == {"r": 8, "alpha": 16, "target_modules": ["all-linear"]}
    assert "#   template: the model's own chat template" in out.err
    assert "#   output_dir:" in out.err and "#   report_to:" in out.err
    with session_scope(server.url) as s:
        job = s.get(Job, job_id)
        assert job is not None
        assert job.spec["training"]["seq_len"] == 512 and job.spec["training"]["max_steps"] == 10
        assert job.spec["resources"]["zero_stage"] == 3  # from the DeepSpeed file it names
        assert job.spec["training"]["gradient_accumulation_steps"] == 2 and job.spec["method"] == "lora"


def test_a_key_tunebox_cannot_honour_is_an_error_naming_it(
    server: Env, roots: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["submit", "--from", "llamafactory", _config(tmp_path, roots, stage="dpo")]) == 1
    assert "stage" in capsys.readouterr().err and server.count(Job) == 0
