"""On a machine with NVIDIA GPUs: NVML inventory, the launcher's card selection, per-process memory."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tunebox import gpus
from tunebox.settings import Settings
from worker import launcher
from worker.leasing import Grant

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def inventory() -> list[gpus.GpuInfo]:
    found = gpus._nvml_inventory()
    if not found:
        pytest.skip("no NVIDIA GPU visible to NVML")
    return found


def test_nvml_inventory_reports_real_cards(inventory, tmp_path):
    assert [g.index for g in inventory] == list(range(len(inventory)))
    for card in inventory:
        assert card.uuid.startswith("GPU-") and card.memory_total_bytes > 2**30
        assert 0 < (card.memory_free_bytes or 0) <= card.memory_total_bytes
        assert card.healthy, card.health_reason
    # where NVML sees cards, the settings' stand-ins are ignored
    assert [g.uuid for g in gpus.local_inventory(Settings(data_dir=tmp_path, gpu_count=5))] == [
        g.uuid for g in inventory]


CHILD = """
import sys, time, torch
x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
print(torch.cuda.device_count(), str(torch.cuda.get_device_properties(0).uuid), flush=True)
time.sleep(60)
"""


def test_launcher_env_selects_the_leased_card_and_the_sampler_sees_it(inventory, tmp_path):
    card = inventory[-1]
    grant = Grant(gpu_ids=(1,), indices=(card.index,), uuids=(card.uuid,), exclusive=True)
    env = launcher.base_env(grant, Settings(data_dir=tmp_path), launcher.RunId("job_gpu", 1, "t"), "train")
    proc = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True)
    sampler = gpus.NvmlSampler()
    try:
        assert proc.stdout is not None
        count, uuid = proc.stdout.readline().split()
        assert count == "1" and card.uuid.endswith(uuid.removeprefix("GPU-"))
        used = None
        for _ in range(50):
            used = sampler.used_bytes({proc.pid})
            if used:
                break
            time.sleep(0.2)
        assert used is not None and used >= 2**30
    finally:
        proc.kill()
        proc.wait()
        sampler.close()
