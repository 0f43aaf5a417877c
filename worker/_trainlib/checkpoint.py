"""Checkpoints: written whole into a hidden folder, then renamed, so ``step-N`` is always complete.

Layout of ``checkpoints/step-N/``: the adapter in peft's format (``adapter_model.safetensors`` +
``adapter_config.json``) or, for full fine-tuning, a consolidated HF model; the tokenizer;
``ds/`` (DeepSpeed engine state for resuming); ``trainer_state.json``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DS_TAG = "state"
STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Found:
    step: int
    path: Path
    state: dict[str, Any]


def latest_complete(root: Path) -> Found | None:
    """The newest ``step-N`` holding a readable trainer state (a renamed folder is complete)."""
    best: Found | None = None
    if not root.is_dir():
        return None
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if not match or not (child / STATE_FILE).is_file():
            continue
        try:
            state = json.loads((child / STATE_FILE).read_text())
        except (OSError, ValueError):
            continue
        step = int(match.group(1))
        if best is None or step > best.step:
            best = Found(step, child, state)
    return best


def complete_steps(root: Path) -> list[int]:
    """Steps of the complete ``step-N`` folders, oldest first."""
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for c in root.iterdir()
                  if (m := _STEP_DIR.match(c.name)) and (c / STATE_FILE).is_file())


def prune(root: Path, keep: int, evaluations: Path | None = None) -> list[int]:
    """Remove all but the newest ``keep`` complete checkpoints (``training.save_total_limit``).

    With evaluations at checkpoints (``evaluations``: the folder of their results, ``step-N.json``),
    a checkpoint is removed only once it or a newer one has its result: the supervisor evaluates
    them in order, so one older than an evaluated checkpoint will never be read again."""
    steps = complete_steps(root)
    removable = steps[:-keep] if keep > 0 else steps
    if evaluations is not None:
        done = [s for s in steps if (evaluations / f"step-{s}.json").is_file()]
        newest_done = max(done, default=-1)
        removable = [s for s in removable if s <= newest_done]
    for step in removable:
        shutil.rmtree(root / f"step-{step}", ignore_errors=True)
    return removable


def remove_partials(root: Path) -> None:
    """Leftovers of a run killed mid-save are never resumed from; clear them."""
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(".tmp-"):
                shutil.rmtree(child, ignore_errors=True)


def _fsync_tree(path: Path) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _barrier() -> None:
    import deepspeed.comm as dist

    if dist.is_initialized():
        dist.barrier()


def _gather_trainable(module: Any, is_rank0: bool) -> dict[str, Any] | None:
    """Full copies of the trainable (adapter) tensors on rank 0; a collective under ZeRO-3."""
    import deepspeed

    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
        if not is_rank0:
            return None
        return {n: p.detach().to("cpu", copy=True) for n, p in named}


def _full_state_dict(engine: Any, is_rank0: bool) -> dict[str, Any] | None:
    """The 16-bit weights on the host, on rank 0 (the planner's checkpoint save counts this copy)."""
    if engine.zero_optimization_partition_weights():
        consolidated: dict[str, Any] | None = engine._zero3_consolidated_16bit_state_dict()
        return consolidated  # a collective; None except on rank 0
    if not is_rank0:  # every rank holds the whole model: only the one that writes copies it
        return None
    return {k: v.detach().to("cpu", copy=True) for k, v in engine.module.state_dict().items()}


def _write_weights(engine: Any, lora: bool, tmp: Path, is_rank0: bool) -> None:
    module = engine.module
    state = _gather_trainable(module, is_rank0) if lora else _full_state_dict(engine, is_rank0)
    if is_rank0:
        assert state is not None
        module.save_pretrained(str(tmp), state_dict=state, safe_serialization=True)


def save(engine: Any, tokenizer: Any, root: Path, step: int, state: dict[str, Any], *, lora: bool,
         is_rank0: bool) -> Path:
    """Write ``root/step-<step>`` as a whole; every rank calls this (the gathers are collectives)."""
    final, tmp = root / f"step-{step}", root / f".tmp-step-{step}"
    try:
        if is_rank0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        engine.save_checkpoint(str(tmp / "ds"), tag=DS_TAG, save_latest=False, exclude_frozen_parameters=lora)
        _write_weights(engine, lora, tmp, is_rank0)
        if is_rank0:
            tokenizer.save_pretrained(str(tmp))
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
        _barrier()
        if is_rank0:
            _fsync_tree(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        _barrier()
    except BaseException as exc:
        full = isinstance(exc, Exception) and _out_of_space(root)  # before the partial folder frees space
        if is_rank0:
            shutil.rmtree(tmp, ignore_errors=True)
        if full:
            # torch.save and safetensors report a full disk as their own errors ("unexpected pos ...")
            raise OSError(errno.ENOSPC, f"no space left on the device of {root} while saving step {step}: "
                          f"{type(exc).__name__}: {exc}") from exc
        raise
    return final


# a write that failed with this little room left failed for want of room
LOW_SPACE_BYTES = 1 << 20


def _out_of_space(path: Path) -> bool:
    try:
        return shutil.disk_usage(path).free < LOW_SPACE_BYTES
    except OSError:
        return False


def resume(engine: Any, found: Found) -> None:
    """Restore the engine (weights, optimizer, LR schedule) from a complete checkpoint."""
    load_path, _ = engine.load_checkpoint(str(found.path / "ds"), tag=DS_TAG, load_module_strict=False)
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint in {found.path / 'ds'}")
