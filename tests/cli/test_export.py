"""Adapters out: the archive routes (owner or admin) and ``tunebox export [--checkpoint N] [--merge]``,
against a live server (Postgres), with a tiny local Llama and a LoRA adapter made by peft."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from store.db import session_scope
from store.ids import new_id
from store.models import Checkpoint
from tests.api.conftest import Env
from tests.tinymodel import build_tiny_model, merge_generations
from tunebox.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("export") / "tiny")


def _adapter(base: Path, dest: Path, seed: int) -> Path:
    """A LoRA adapter whose weights are not zero (so merging changes the model), with a ds/ folder."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    model.save_pretrained(dest)
    (dest / "ds").mkdir()
    (dest / "ds" / "optimizer_states.pt").write_bytes(b"x" * 1000)
    return dest


def _checkpoints(url: str, job_id: str, *steps: tuple[int, Path, bool]) -> None:
    with session_scope(url) as s:
        for step, path, final in steps:
            s.add(Checkpoint(id=new_id("ckpt"), job_id=job_id, step=step, path=str(path), is_final=final))


def _names(body: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return tar.getnames()


def test_archives_are_the_owners_and_leave_the_resume_state_out(server: Env, tiny: Path, tmp_path: Path):
    job_id = server.submit()["id"]
    _checkpoints(server.url, job_id, (4, _adapter(tiny, tmp_path / "step-4", 1), False))
    res = server.client.get(f"/v1/jobs/{job_id}/checkpoints/4/archive", headers=server.auth())
    assert res.status_code == 200 and res.headers["content-type"] == "application/gzip"
    names = _names(res.content)
    assert f"{job_id}-step-4/adapter_config.json" in names and not any("/ds/" in n for n in names)
    with_state = server.client.get(
        f"/v1/jobs/{job_id}/checkpoints/4/archive?with_state=true", headers=server.auth()
    )
    assert f"{job_id}-step-4/ds/optimizer_states.pt" in _names(with_state.content)
    assert server.client.get(f"/v1/jobs/{job_id}/adapter", headers=server.auth("bob")).status_code == 404
    assert server.client.get(f"/v1/jobs/{job_id}/adapter", headers=server.auth("root")).status_code == 200
    missing = server.client.get(f"/v1/jobs/{job_id}/checkpoints/9/archive", headers=server.auth())
    assert missing.status_code == 404


def test_export_the_adapter_and_a_merged_model_that_generates_the_same_tokens(
    server: Env, tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    import torch

    job_id = server.submit()["id"]
    _checkpoints(
        server.url,
        job_id,
        (4, _adapter(tiny, tmp_path / "step-4", 1), False),
        (8, _adapter(tiny, tmp_path / "step-8", 2), True),
    )
    assert main(["export", job_id, str(tmp_path / "final")]) == 0
    assert (tmp_path / "final" / "adapter_config.json").is_file() and not (tmp_path / "final" / "ds").exists()
    final = (tmp_path / "final" / "adapter_model.safetensors").read_bytes()
    assert final == (tmp_path / "step-8" / "adapter_model.safetensors").read_bytes()
    assert main(["export", job_id, "--checkpoint", "4", str(tmp_path / "four")]) == 0
    assert (tmp_path / "four" / "adapter_model.safetensors").read_bytes() == (
        tmp_path / "step-4" / "adapter_model.safetensors"
    ).read_bytes()
    assert main(["export", job_id, "--merge", "--base", str(tiny), str(tmp_path / "merged")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(tmp_path / "merged")

    merged, ours, theirs, untouched = merge_generations(tmp_path / "merged", tiny, tmp_path / "step-8")
    assert merged.dtype == torch.bfloat16 and not hasattr(merged, "peft_config")
    assert ours == theirs
    assert ours != untouched  # the adapter changed what the model says
