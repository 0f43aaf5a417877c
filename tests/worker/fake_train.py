"""A stand-in training process for the worker tests (``TUNEBOX_TRAIN_MODULE``).

It speaks the real contract (run.json in; progress.jsonl, failure.json, checkpoints out) without
torch, so dispatch, leases, cancel and failure paths are tested in seconds. The job's spec name
picks the behaviour: ``fake:ok``, ``fake:long``, ``fake:stubborn`` (ignores SIGTERM),
``fake:user-error``, ``fake:sigkill``, ``fake:no-done``, ``fake:oom-once-N`` (the first run fails
``cuda_oom`` as the real training does under its allocator limit, having needed N GiB; later runs
succeed) and ``fake:oom-always-N``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def emit(job_dir: Path, kind: str, **fields: object) -> None:
    with (job_dir / "progress.jsonl").open("a") as fh:
        fh.write(json.dumps({"type": kind, **fields, "time": time.time()}) + "\n")


def write_swap_files(run: dict, job_dir: Path) -> None:
    """Swap files where the run's DeepSpeed config puts NVMe offload, as DeepSpeed writes them; their
    paths go to ``swap.txt`` in the job folder."""
    zero = run["deepspeed_config"].get("zero_optimization") or {}
    for name in ("offload_optimizer", "offload_param"):
        block = zero.get(name) or {}
        if block.get("device") == "nvme":
            folder = Path(block["nvme_path"]) / "zero_stage_3" / name / "rank0"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "0.tensor.swp").write_bytes(b"\0" * 4096)
            with (job_dir / "swap.txt").open("a") as fh:
                fh.write(f"{folder / '0.tensor.swp'}\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", type=Path, required=True)
    job_dir = parser.parse_args().job_dir
    run = json.loads((job_dir / "run.json").read_text())
    mode = run["spec"]["name"].removeprefix("fake:")
    with (job_dir / "pids.txt").open("a") as fh:
        fh.write(f"{os.getpid()} {os.getpgid(0)} {os.environ.get('RANK')}\n")
    print(f"fake training {mode} pid {os.getpid()} device {run['device']}", flush=True)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode in ("long", "stubborn"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (job_dir / "child.pid").write_text(str(child.pid))
    steps = 10_000 if mode in ("long", "stubborn") else int(run["spec"]["training"]["max_steps"])
    emit(job_dir, "start", total_steps=steps, pid=os.getpid())
    write_swap_files(run, job_dir)
    if mode == "user-error":
        (job_dir / "failure.json").write_text(json.dumps(
            {"kind": "user_error", "reason": "bad_dataset", "message": "row 3: missing field 'output'"}))
        print("Traceback: row 3 has no output", flush=True)
        return 2
    if mode.startswith(("oom-once-", "oom-always-")) and (
            mode.startswith("oom-always-") or os.environ.get("TUNEBOX_JOB_ATTEMPT") == "1"):
        need = int(float(mode.rsplit("-", 1)[1]) * 2**30)
        data = {"gpu_memory_limit_bytes": run.get("gpu_memory_limit_bytes") or need - 2**30,
                "max_reserved_bytes": need - 2**29, "max_allocated_bytes": need - 2**30,
                "requested_bytes": 2**29}
        (job_dir / "failure.json").write_text(json.dumps(
            {"kind": "error", "reason": "cuda_oom", "data": data,
             "message": "CUDA out of memory. Tried to allocate 512.00 MiB"}))
        return 3
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    step_s = float(os.environ.get("FAKE_STEP_S", "0.1"))
    save = int(run["spec"]["training"].get("save_steps") or 2)
    for step in range(1, steps + 1):
        time.sleep(step_s)
        emit(job_dir, "progress", step=step, total_steps=steps, epoch=step / steps, loss=5.0 / step,
             lr=1e-4, tokens_per_second=100.0, samples_per_second=4.0, peak_gpu_bytes=1000 + step,
             host_rss_bytes=2000 + step, host_cpu_percent=50.0, eta_seconds=(steps - step) * step_s)
        if step % save == 0:
            path = job_dir / "checkpoints" / f"step-{step}"
            path.mkdir(parents=True, exist_ok=True)
            (path / "adapter.bin").write_bytes(b"x" * 10)
            emit(job_dir, "checkpoint", step=step, path=str(path))
    if mode == "no-done":
        return 0
    final = job_dir / "final"
    final.mkdir(exist_ok=True)
    emit(job_dir, "done", step=steps, final_path=str(final), peak_gpu_bytes=5000, host_peak_rss_bytes=6000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
