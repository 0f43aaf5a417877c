"""Fault 6: the job folder's file system fills up while the real trainer writes a checkpoint.

The data folder of the real stack is a 256 MiB tmpfs; once the first checkpoint is complete the
test takes all but 64 KiB of it, so the next checkpoint cannot be written (ENOSPC, for real). The
job fails ``disk_full`` and only complete checkpoints are listed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
from pathlib import Path

import pytest

from tests.reliability.support import (
    TERMINAL,
    Stack,
    checkpoint_steps,
    job_processes,
    lease_count,
    lora_spec,
    submit,
)
from tests.worker.harness import wait_for, wait_job

pytestmark = pytest.mark.slow
LEFT_FREE = 64 * 1024


def fill(path: Path, leave: int) -> int:
    """Write ``path`` until its file system has about ``leave`` bytes free; returns bytes written."""
    written, chunk = 0, b"\0" * (1 << 20)
    with path.open("wb") as fh:
        while (free := shutil.disk_usage(path.parent).free) > leave:
            try:
                fh.write(chunk[: min(len(chunk), free - leave)])
                fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
            written += min(len(chunk), free - leave)
    return written


def test_full_disk_while_checkpointing_fails_disk_full_and_lists_only_complete_checkpoints(
        real_stack: Stack) -> None:
    stack = real_stack
    if not stack.on_tmpfs:
        pytest.skip("mounting a small tmpfs needs root (CAP_SYS_ADMIN); a real full disk cannot be made here")
    filler = stack.data_dir / "filler.bin"
    try:
        with stack.client() as client:
            job_id = submit(client, lora_spec("disk-fills", max_steps=200, save_steps=10))
            job_dir = stack.job_dir(job_id)
            wait_for(lambda: checkpoint_steps(job_dir), 480, "the first complete checkpoint", every=0.05)
            assert fill(filler, LEFT_FREE) > 100 * 2**20
            done = wait_job(client, job_id, TERMINAL, 300, *stack.workers)
            listed = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
    finally:
        with contextlib.suppress(FileNotFoundError):
            filler.unlink()

    assert done["status"] == "failed", done
    assert (done["failure"]["kind"], done["failure"]["reason"]) == ("error", "disk_full"), done["failure"]
    assert done["progress"]["step"] < 200
    assert listed, "the checkpoint written before the disk filled is listed"
    for item in listed:
        folder = Path(item["path"])
        state = json.loads((folder / "trainer_state.json").read_text())
        assert folder.name == f"step-{item['step']}" and state["step"] == item["step"]
        assert (folder / "adapter_model.safetensors").is_file() and (folder / "ds").is_dir()
    on_disk = sorted(p.name for p in (job_dir / "checkpoints").iterdir())
    assert on_disk == [f"step-{item['step']}" for item in listed]  # no half-written folder left
    assert not job_processes(job_id) and lease_count(stack.db_url, job_id) == 0
