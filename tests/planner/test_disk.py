"""Checkpoints on disk: counted before the job takes a GPU, refused when the disk cannot hold them."""

from __future__ import annotations

from typing import Any

import pytest

from planner import PlanError, plan
from tests.planner.support import GIB, hardware

QWEN_3B = "Qwen/Qwen2.5-3B"


def spec(method: str, steps: int, save_steps: int, limit: int | None,
         free_gib: float | None) -> dict[str, Any]:
    hw = hardware(gpus=1, gpu_bytes=140 * GIB, host_gib=125)
    if free_gib is not None:
        hw["disk_free_bytes"] = int(free_gib * GIB)
    return {"model": {"name": QWEN_3B}, "method": method, "hardware": hw,
            "training": {"max_steps": steps, "epochs": None, "save_steps": save_steps,
                         "save_total_limit": limit}}


def test_a_full_checkpoint_is_weights_model_states_master_and_moments() -> None:
    p = plan(spec("full", 100, 100, 2, None))
    n = p.model.num_parameters
    # bf16 weights file + bf16 model states + fp32 master + AdamW's two fp32 moments
    assert p.disk.checkpoint_bytes == pytest.approx(n * (2 + 2 + 4 + 8), rel=1e-6)
    lora = plan(spec("lora", 100, 100, 2, None))
    assert lora.disk.checkpoint_bytes < p.disk.checkpoint_bytes / 100  # only the adapters


@pytest.mark.parametrize(("steps", "save_steps", "limit", "peak"), [
    (1000, 200, None, 5),  # every save kept
    (1000, 200, 2, 3),  # the newest two and the one being written
    (1000, 300, 1, 2),  # saves at 300, 600, 900 and the last step
    (100, 200, 2, 1),  # one save: the last step
])
def test_the_checkpoints_at_peak_follow_the_saves_and_the_limit(steps: int, save_steps: int,
                                                               limit: int | None, peak: int) -> None:
    p = plan(spec("full", steps, save_steps, limit, None))
    assert p.disk.checkpoints_at_peak == peak
    assert p.disk.total_bytes == peak * p.disk.checkpoint_bytes
    assert p.disk.fits and p.disk.free_bytes is None


def test_a_3b_full_fine_tune_on_a_nearly_full_disk_is_refused_before_it_runs() -> None:
    with pytest.raises(PlanError) as err:
        plan(spec("full", 1000, 200, 2, 40))  # three 45 GB checkpoints on a box with 40 GiB free
    assert err.value.code == "insufficient_disk"
    assert err.value.field == "training.save_total_limit"
    assert "GiB on disk" in err.value.message and "40.0 GiB free" in err.value.message
    fits = plan(spec("full", 1000, 200, 2, 200))
    assert fits.disk.fits and fits.disk.free_bytes == 200 * GIB


def test_a_job_the_gpus_refuse_keeps_its_alternatives_and_warns_of_the_disk() -> None:
    s = spec("full", 1000, 200, 2, 40)
    s["hardware"]["gpu_memory_bytes"] = 8 * GIB  # a 3B full fine-tune does not fit an 8 GiB card
    p = plan(s)
    assert not p.fits and p.alternatives
    assert not p.disk.fits
    assert any(w.code == "insufficient_disk" and w.field == "training.save_total_limit" for w in p.warnings)


def _nvme_optimizer(free_gib: float, shared: bool) -> dict[str, Any]:
    """Qwen2.5-1.5B full fine-tuning with the optimizer on NVMe, one final checkpoint."""
    s = spec("full", 8, 80, None, free_gib)
    s["model"] = {"name": "Qwen/Qwen2.5-1.5B"}
    s["hardware"].update(nvme_bytes=100 * GIB, nvme_path="/scratch", nvme_on_job_disk=shared)
    s["resources"] = {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "nvme", "offload_param": "none"}
    return s


def test_nvme_swap_files_on_the_disk_of_the_job_folder_take_the_checkpoints_room() -> None:
    """The optimizer's swap files (fp32 master, moments and gradients: 23 GiB for 1.5B) and its final
    checkpoint (another 23 GiB) on one disk with 40 GiB free: refused, naming both; with the swap on
    another disk, the checkpoint alone fits."""
    apart = plan(_nvme_optimizer(40, shared=False))
    assert apart.disk.fits and apart.disk.nvme_swap_bytes == 0
    assert apart.nvme.total_bytes > 20 * GIB and apart.disk.checkpoint_bytes > 20 * GIB
    with pytest.raises(PlanError) as err:
        plan(_nvme_optimizer(40, shared=True))
    assert err.value.field == "training.save_total_limit"
    assert "GiB of NVMe swap files on the same disk" in str(err.value)
    roomy = plan(_nvme_optimizer(60, shared=True))
    assert roomy.disk.nvme_swap_bytes == roomy.nvme.total_bytes
    assert roomy.disk.total_bytes == roomy.disk.checkpoint_bytes + roomy.nvme.total_bytes
