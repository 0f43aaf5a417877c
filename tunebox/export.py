"""``tunebox export``: a job's adapter out of the service, or merged into its base model.

The merge loads torch, transformers and peft, in the CLI's process only.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from tunebox.data_keys import TOKENIZER_FILES


def unpack(archive: Path, into: Path) -> Path:
    """The one folder an archive from ``GET /v1/jobs/{id}/checkpoints/{step}/archive`` holds."""
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(into, filter="data")
    folders = [p for p in into.iterdir() if p.is_dir()]
    if len(folders) != 1:
        raise ValueError(f"{archive}: expected one folder in the archive, found {len(folders)}")
    return folders[0]


def is_adapter(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file()


def merge(adapter: Path, base: Path, dest: Path) -> None:
    """Write ``dest``: the base model with the adapter merged in, in bf16, with the tokenizer.

    A QLoRA adapter merges into the base model's own (unquantised) weights loaded in bf16.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    dest.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(dest, safe_serialization=True)
    tokenizer_source = adapter if any((adapter / f).is_file() for f in TOKENIZER_FILES) else base
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(dest)


def copy_folder(folder: Path, dest: Path) -> None:
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty")
    shutil.copytree(folder, dest, dirs_exist_ok=True)
