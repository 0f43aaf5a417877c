"""Parameters on NVMe through the worker's own path on the CPU: the plan's DeepSpeed config (its swap
buffers included), the launcher's run file and ranks, DeepSpeed's async I/O op built against the
libaio that ``bench/libaio.py`` unpacks."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

from bench.libaio import VENDOR, environment, unpack
from planner import plan
from planner.spec import HardwareSpec
from store.models import Job
from tests.tinydata import write_dataset
from tests.worker_train import planned
from tests.worker_train.planned import Mode, losses, spec_of

NVME_BYTES = 4 * 2**30


def test_a_job_with_its_parameters_on_nvme_trains_with_the_plans_swap_config(
    tiny_model: Path, tmp_path: Path
) -> None:
    prefix = tmp_path / "libaio"
    for deb in sorted(VENDOR.glob("*.deb")):
        unpack(deb, prefix)
    swap = tmp_path / "swap"
    swap.mkdir()
    data = write_dataset(tmp_path / "alpaca.jsonl", "alpaca", n=48)
    spec = spec_of(Mode(stage=3, precision="bf16", optimizer="adamw", method="lora", lr=1e-3, offload="cpu",
                        steps=3), tiny_model, data)
    spec["resources"]["offload_param"] = "nvme"
    spec["training"]["gradient_checkpointing"] = True
    # every tensor swapped, none kept on the card as persistent
    spec["resources"]["deepspeed"] = {"stage3_param_persistence_threshold": 0}
    made = plan(spec, hardware=HardwareSpec(
        gpu_count=1, gpu_memory_bytes=planned.CARD_BYTES, host_memory_bytes=planned.HOST_BYTES,
        nvme_bytes=NVME_BYTES, nvme_path=str(swap)))
    assert made.fits and made.nvme.total_bytes > 0
    block = made.deepspeed_config["zero_optimization"]["offload_param"]
    assert block["device"] == "nvme" and block["nvme_path"] == str(swap)
    job = Job(id="job_test", spec=spec, plan=made.model_dump(mode="json"), num_gpus=1)
    cfg = planned.settings(tmp_path / "data", train_module="worker.train", gpu_count=1, nvme_path=swap,
                           nvme_bytes=NVME_BYTES)
    job_dir = tmp_path / "job"
    with mock.patch.object(planned, "planned_job", return_value=job):
        run = planned.write_planned_run(job_dir, spec, 1, cfg)
    # the job's swap files go to a folder of its own under the box's
    swapped = run["deepspeed_config"]["zero_optimization"]["offload_param"]
    assert swapped["nvme_path"] == str(swap / "job_test")
    with mock.patch.dict(os.environ, environment(prefix)):
        # the job builds DeepSpeed's async I/O op and swaps every tensor through it on two cores:
        # 6 min 17 s alone on the 2-core CI box, more beside other work
        code = planned.train(job_dir, 1, cfg, timeout=900)
    assert code == 0, planned.log_tail(job_dir)
    assert len(losses(job_dir)) == 3
    # the bf16 parameters DeepSpeed wrote to the swap folder, against the plan's NVMe figure
    # DeepSpeed's parameter swapper was built from the plan's block (its async I/O op loaded, its
    # buffers allocated) and made its rank's folder; on the CPU accelerator the parameters stay in
    # memory, so the bytes swapped are measured on the GPU (bench/nvme_offload.py)
    assert (swap / "job_test" / "zero_stage_3" / "bfloat16params" / "rank0").is_dir()
