"""NVMe offload through the service, against the same jobs with CPU offload.

Unpacks libaio (``bench/libaio.py``) so DeepSpeed's async I/O op builds, starts ``tunebox serve``
on its embedded default with ``TUNEBOX_NVME_BYTES``/``TUNEBOX_NVME_PATH`` set, and runs, one job at
a time, the pairs asked for:

- ``lora7b`` (``lora1.5b``, ``lora3b``, ``lora-llama1b``): LoRA on a random-init Qwen2.5-7B (1.5B,
  3B; Llama 3.2 1B), ZeRO-3 with the parameters on NVMe (and the optimizer on the CPU), then the
  same job with both on the CPU;
- ``full3b`` (``full1.5b``): full fine-tuning of a random-init Qwen2.5-3B (1.5B), ZeRO-3 with the
  optimizer on NVMe, then with the optimizer on the CPU.

For each job: status history, the GPU and host peaks and the NVMe bytes against the plan (the swap
folder's size, sampled while it runs), steady tokens/s, and the NVMe run's tokens/s over the CPU
run's. Writes one JSON report after every job. One pair fits one device call; the work folder
(models, swap, database) stays between calls on a warm machine.

    python3 -m bench.nvme_offload --out $OUT/nvme-lora7b.json --pairs lora7b
    python3 -m bench.nvme_offload --out $OUT/nvme-full3b.json --pairs full3b
    python3 -m bench.nvme_offload --out /tmp/nvme-tiny.json --pairs lora7b --tiny   # CPU smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.libaio import VENDOR as AIO_VENDOR
from bench.libaio import check as aio_check
from bench.libaio import environment as aio_environment
from bench.libaio import unpack as aio_unpack
from bench.service_gpu import (
    REPO,
    build_dataset,
    build_model,
    collect,
    free_port,
    job_spec,
    progress_lines,
    stop_serve,
    tunebox,
    wait_jobs,
    wait_ready,
)

PAIRS: dict[str, dict[str, Any]] = {
    "lora7b": {
        "model": "qwen2.5-7b",
        "method": "lora",
        "nvme": {"offload_param": "nvme", "offload_optimizer": "cpu"},
        "cpu": {"offload_param": "cpu", "offload_optimizer": "cpu"},
    },
    # the same on a model a fifth the size (a held-out check of the host figure)
    "lora1.5b": {
        "model": "qwen2.5-1.5b",
        "method": "lora",
        "nvme": {"offload_param": "nvme", "offload_optimizer": "cpu"},
        "cpu": {"offload_param": "cpu", "offload_optimizer": "cpu"},
    },
    # a larger model that ties its LM head to its embedding, as the 1.5B does and the 7B does not
    "lora3b": {
        "model": "qwen2.5-3b",
        "method": "lora",
        "nvme": {"offload_param": "nvme", "offload_optimizer": "cpu"},
        "cpu": {"offload_param": "cpu", "offload_optimizer": "cpu"},
    },
    # another family's tied head (Llama 3.2 1B: 128k vocabulary, 2,048 wide)
    "lora-llama1b": {
        "model": "llama-3.2-1b",
        "method": "lora",
        "nvme": {"offload_param": "nvme", "offload_optimizer": "cpu"},
        "cpu": {"offload_param": "cpu", "offload_optimizer": "cpu"},
    },
    "full3b": {
        "model": "qwen2.5-3b",
        "method": "full",
        "nvme": {"offload_param": "none", "offload_optimizer": "nvme"},
        "cpu": {"offload_param": "none", "offload_optimizer": "cpu"},
    },
    # the same on a disk too small for full3b's optimizer swap (48 GB) beside its final checkpoint
    "full1.5b": {
        "model": "qwen2.5-1.5b",
        "method": "full",
        "nvme": {"offload_param": "none", "offload_optimizer": "nvme"},
        "cpu": {"offload_param": "none", "offload_optimizer": "cpu"},
    },
}


def _folder_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a swap file removed meanwhile
                total += (Path(root) / name).stat().st_size
    return total


def rss_by_phase(timeline: list[tuple[float, int]], lines: list[dict[str, Any]]) -> dict[str, int | None]:
    """The largest sampled RSS of the training process in each phase of its run, by the times of
    its progress file: ``load`` (to the trainer's start line: the model, DeepSpeed's initialisation),
    ``first_step`` (to the first step's line: the optimizer's states made), ``steps`` (to the last
    step's line) and ``save`` (after it)."""
    start = next((ln["time"] for ln in lines if ln.get("type") == "start"), None)
    steps = [ln["time"] for ln in lines if ln.get("type") == "progress"]
    ends = {"load": start, "first_step": steps[0] if steps else None, "steps": steps[-1] if steps else None,
            "save": None}
    out: dict[str, int | None] = {}
    low: float | None = float("-inf")
    for phase, end in ends.items():
        if low is None:  # the run ended in an earlier phase
            out[phase] = None
            continue
        high = float("inf") if end is None else end  # the phase the run ended in takes the rest
        seen = [rss for t, rss in timeline if low < t <= high]
        out[phase] = max(seen) if seen else None
        low = end
    return out


def _swap_left(path: Path, wait: float = 60.0) -> int:
    """What is left of a job's swap folder once the worker has cleaned up after its run (it removes
    the folder after the job's last status: wait for that, up to ``wait`` seconds)."""
    deadline = time.monotonic() + wait
    while path.exists() and time.monotonic() < deadline:
        time.sleep(1.0)
    return _folder_bytes(path)


def _training_rss() -> int:
    """Resident bytes of the training processes running now (``python -m worker.train``)."""
    import psutil

    total = 0
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = proc.info.get("cmdline") or []
        if "worker.train" in cmd and proc.info.get("memory_info") is not None:
            total += proc.info["memory_info"].rss
    return total


class SwapSampler(threading.Thread):
    """The largest size the NVMe swap folder reached, and the training process's host RSS over
    time (to place its peak among the run's phases, whose times its progress file gives)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.peak, self.stop = path, 0, threading.Event()
        self.rss: list[tuple[float, int]] = []

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.peak = max(self.peak, _folder_bytes(self.path))
            if rss := _training_rss():
                self.rss.append((round(time.time(), 2), rss))


def _spec(
    pair: dict[str, Any], where: str, model: Path, data: Path, steps: int, seq_len: int, micro: int
) -> dict[str, Any]:
    spec = job_spec(
        f"{pair['model']}-{pair['method']}-{where}", model, data, pair["method"], "cpu", steps, seq_len, micro
    )
    spec["resources"].update(pair[where])
    spec["training"]["save_steps"] = steps * 10  # the final save only: the disk holds the swap
    spec["eval"] = {"when": "none"}
    return spec


def _run_job(
    client: httpx.Client, spec: dict[str, Any], data_dir: Path, swap: Path, timeout: float
) -> dict[str, Any]:
    resp = client.post("/v1/jobs", json=spec)
    if resp.status_code != 201:
        return {"submit_error": resp.json()}
    jid = resp.json()["id"]
    sampler = SwapSampler(swap / jid)  # the job's own swap folder (worker.launcher.with_job_swap)
    sampler.start()
    try:
        job = wait_jobs(client, [jid], timeout)[jid]
    finally:
        sampler.stop.set()
        sampler.join()
    result = collect(client, job, data_dir)
    plan = job["plan"]
    result.update(
        planned_nvme_bytes=plan["nvme"]["total_bytes"],
        measured_nvme_bytes=sampler.peak,
        host_rss_timeline=sampler.rss,
        host_rss_by_phase=rss_by_phase(sampler.rss, progress_lines(data_dir / "jobs" / jid)),
        planned_host_bytes=plan["host"]["total_bytes"],
        measured_host_rss_bytes=(job.get("progress") or {}).get("measured_host_rss_bytes"),
        swap_left_bytes=_swap_left(swap / jid),
        planned_tokens_per_second=plan["estimated_tokens_per_second"],
    )
    shutil.rmtree(data_dir / "jobs" / jid / "checkpoints", ignore_errors=True)
    return result


def replan(result: dict[str, Any], where: Path) -> Any:
    """A job of a report planned by today's planner as it ran: its spec with the model as a folder
    of the bench model's config and a weight file of its size (``bench.field_cases.model_folder``),
    on the box its plan saw (GPU, host memory, NVMe space)."""
    from bench.cases import MODELS
    from bench.field_cases import model_folder
    from planner import plan

    job = result["job"]
    name = Path(job["spec"]["model"]["path"]).name.removesuffix("-random")
    hw = job["plan"]["hardware"]
    spec = {**job["spec"], "model": {"path": str(model_folder(dict(MODELS[name]), where))}}
    spec["dataset"] = {**spec["dataset"], "path": "rows.jsonl", "eval_fraction": 0.0}
    spec["hardware"] = {"gpu_count": hw["gpu_count"], "gpu_name": hw["gpu_name"],
                        "gpu_memory_bytes": int(hw["gpu_memory_bytes"]["value"]),
                        "host_memory_bytes": int(hw["host_memory_bytes"]["value"]),
                        "nvme_bytes": int(hw["nvme_bytes"]["value"])}
    return plan(spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "nvme-bench")
    ap.add_argument("--pairs", default="lora7b", help=", ".join(PAIRS) + ", comma-separated")
    ap.add_argument("--sides", default="nvme,cpu", help="which jobs of each pair run: nvme, cpu or both")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=420, help="seconds per job")
    ap.add_argument("--tiny", action="store_true", help="tiny models on the CPU: a smoke test of this script")
    ap.add_argument("--deepspeed", type=json.loads, default={}, metavar="JSON",
                    help="resources.deepspeed of every job (knobs the plan keeps as given)")
    args = ap.parse_args()
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    if not pairs or not set(pairs) <= set(PAIRS):
        ap.error(f"--pairs takes {', '.join(PAIRS)}")
    sides = [w.strip() for w in args.sides.split(",") if w.strip()]
    if not sides or not set(sides) <= {"nvme", "cpu"}:
        ap.error("--sides takes nvme, cpu or both")
    t0, work = time.monotonic(), args.work
    prefix = work / "libaio"
    for deb in sorted(AIO_VENDOR.glob("*.deb")):
        aio_unpack(deb, prefix)
    env = {**os.environ, **aio_environment(prefix)}
    report: dict[str, Any] = {
        "aio": aio_check(aio_environment(prefix)),
        "steps": args.steps,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "deepspeed": args.deepspeed,
    }
    models, datasets, data_dir, swap = work / "models", work / "data", work / "tunebox", work / "swap"
    swap.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.tiny else "cuda"
    data = build_dataset(
        datasets / "pattern.jsonl", rows=args.steps * args.micro_batch * 4, words=args.seq_len
    )
    env.update(
        {
            "TUNEBOX_DATA_DIR": str(data_dir),
            "TUNEBOX_MODEL_ROOTS": json.dumps([str(models)]),
            "TUNEBOX_DATASET_ROOTS": json.dumps([str(datasets)]),
            "TUNEBOX_WORKER_CONCURRENCY": "1",
            "TUNEBOX_PROGRESS_INTERVAL_S": "1",
            "TUNEBOX_NVME_PATH": str(swap),
            "TUNEBOX_NVME_BYTES": str(shutil.disk_usage(swap).free - 8 * 2**30),
            "PYTHONPATH": f"{REPO}:{env.get('PYTHONPATH', '')}",
        }
    )
    if args.tiny:
        env.update(
            {"DS_ACCELERATOR": "cpu", "TUNEBOX_GPU_COUNT": "1", "TUNEBOX_GPU_MEMORY_BYTES": str(24 * 2**30)}
        )
    env.pop("TUNEBOX_BROKER_URL", None)
    env.pop("TUNEBOX_DATABASE_URL", None)
    tunebox(env, "db", "upgrade")
    token = tunebox(env, "token", "create", f"bench-{int(time.time())}", "--admin").strip().splitlines()[0]
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "tunebox.cli", "serve", "--port", str(port)],
        env=env,
        cwd=REPO,
        stdout=(work / "serve.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", timeout=30, headers={"Authorization": f"Bearer {token}"}
    )
    try:
        wait_ready(client, serve, 120, work / "serve.log")
        for name in pairs:
            pair = PAIRS[name]
            model = build_model(pair["model"], models / f"{pair['model']}-random", device)
            report[name] = {}
            for where in sides:
                spec = _spec(pair, where, model, data, args.steps, args.seq_len, args.micro_batch)
                spec["resources"]["deepspeed"] = dict(args.deepspeed)
                report[name][where] = _run_job(client, spec, data_dir, swap, args.timeout)
                args.out.write_text(json.dumps(report, indent=1, default=str))
            nvme, cpu = (report[name].get(w, {}).get("steady_tokens_per_second") for w in ("nvme", "cpu"))
            report[name]["nvme_over_cpu_tokens_per_second"] = round(nvme / cpu, 4) if nvme and cpu else None
        report["gpus"] = client.get("/v1/gpus").json()
    finally:
        stop_serve(serve)
    report["total_seconds"] = round(time.monotonic() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "gpus"}, default=str)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
