"""Packing and the chunked loss through the whole service on a GPU box.

Builds random-init models of published shapes (Qwen2.5-7B and Llama-3.1-8B, a locally trained
tokenizer) and a synthetic alpaca file whose token lengths follow an instruction set's shape, starts
``tunebox serve`` on its embedded default, and runs through the REST API, one job at a time:

- ``packing``: 7B LoRA at seq 2048, the same rows and batch shape packed (the default) and unpacked
  (length-grouped batches); real (non-pad) tokens/s of each, their ratio, both loss curves, GPU peak
  against the plan;
- ``chunked``: an 8B Llama-shaped LoRA job at 2 x 2048 (packed) with ``loss_chunk_tokens`` under a
  24 GiB per-card limit: GPU peak against the plan, and the plan the same job gets with full logits.

The lengths: a row's token count is drawn from a log-normal with median 150 and sigma 1.0 (so about
1% of rows reach the 1,500 cap), clipped to [16, 1500]; 30% of it is the instruction, the rest the
answer. The report gives the lengths the model's tokenizer measured (p50/p95/max), not the draws.

    python3 -m bench.datasets_gpu --out report.json [--phase packing --phase chunked] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.service_gpu import (
    REPO,
    WORDS,
    build_model,
    free_port,
    progress_lines,
    stop_serve,
    tunebox,
    wait_ready,
)

GIB = 2**30
MEDIAN_TOKENS, SIGMA, MIN_TOKENS, MAX_TOKENS = 150, 1.0, 16, 1500
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def row_lengths(rows: int, seed: int = 0) -> list[int]:
    """Token counts of ``rows`` rows: log-normal, median MEDIAN_TOKENS, clipped to the range."""
    rng = random.Random(seed)
    mu = math.log(MEDIAN_TOKENS)
    return [min(MAX_TOKENS, max(MIN_TOKENS, round(rng.lognormvariate(mu, SIGMA)))) for _ in range(rows)]


def build_dataset(path: Path, rows: int, seed: int = 0) -> Path:
    """The synthetic alpaca file: each row about its drawn length in words (one word is about one
    token to the bench tokenizer), the answer a learnable continuation of the instruction's words."""
    rng = random.Random(seed + 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for n in row_lengths(rows, seed):
            ask = max(4, round(0.3 * n))
            seed_words = [rng.choice(WORDS) for _ in range(4)]
            prompt = " ".join(rng.choice(WORDS) for _ in range(ask - 4)) + " " + " ".join(seed_words)
            answer = " ".join(seed_words[i % 4] for i in range(max(2, n - ask)))
            f.write(
                json.dumps({"instruction": "Continue the sequence.", "input": prompt, "output": answer})
                + "\n"
            )
    return path


def percentiles(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]  # noqa: E731
    return {
        "p50": pick(0.5),
        "p95": pick(0.95),
        "p99": pick(0.99),
        "max": ordered[-1],
        "mean": round(statistics.fmean(ordered), 1),
    }


def spec(
    name: str, model: Path, data: Path, steps: int, *, micro: int, packing: bool, chunk: int | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"path": str(model)},
        "dataset": {
            "path": str(data),
            "format": "alpaca",
            "eval_fraction": 0.0,
            "max_dropped_fraction": 0.05,
        },
        "method": "lora",
        "lora": {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": TARGETS},
        "training": {
            "max_steps": steps,
            "epochs": None,
            "learning_rate": 2e-4,
            "lr_scheduler": "constant",
            "warmup_ratio": 0.0,
            "micro_batch_size": micro,
            "gradient_accumulation_steps": 1,
            "seq_len": 2048,
            "gradient_checkpointing": True,
            "precision": "bf16",
            "save_steps": 100_000,
            "seed": 42,
            "packing": packing,
            "loss_chunk_tokens": chunk,
        },
        "resources": {
            "num_gpus": 1,
            "zero_stage": "auto",
            "offload_optimizer": "auto",
            "offload_param": "auto",
        },
        "eval": {"when": "none"},
    }


def steady(lines: list[dict[str, Any]], key: str, skip: int = 3) -> float | None:
    values = [ln[key] for ln in lines if ln["type"] == "progress" and ln["step"] > skip and ln.get(key)]
    return statistics.median(values) if values else None


def result(client: httpx.Client, jid: str, data_dir: Path) -> dict[str, Any]:
    job = client.get(f"/v1/jobs/{jid}").json()
    lines = progress_lines(data_dir / "jobs" / jid)
    points = client.get(f"/v1/jobs/{jid}/metrics").json()["points"]
    per_gpu = (job.get("plan") or {}).get("per_gpu") or {}
    nvml = max((ln.get("nvml_peak_bytes") or 0 for ln in lines), default=0) or None
    reserved = max((ln.get("peak_gpu_bytes") or 0 for ln in lines), default=0) or None
    start = next((ln for ln in lines if ln["type"] == "start"), {})
    return {
        "id": jid,
        "status": job["status"],
        "failure": job.get("failure"),
        "resolved": (job.get("plan") or {}).get("resolved"),
        "planned_total_bytes": per_gpu.get("total_bytes"),
        "planned_logits_bytes": per_gpu.get("logits_bytes"),
        "nvml_peak_bytes": nvml,
        "torch_peak_reserved_bytes": reserved,
        "peak_over_plan": round(nvml / per_gpu["total_bytes"], 4)
        if nvml and per_gpu.get("total_bytes")
        else None,
        "real_tokens_per_second": steady(lines, "tokens_per_second"),
        "samples_per_second": steady(lines, "samples_per_second"),
        "loss_curve": [(p["step"], p["loss"]) for p in sorted(points, key=lambda p: p["step"])],
        "data_report": job.get("data_report"),
        "packed_rows": start.get("packed_rows"),
    }


def serve(
    work: Path, models: list[Path], data: Path, limit_gib: float | None
) -> tuple[Any, httpx.Client, Path]:
    data_dir = work / f"tunebox-{limit_gib or 'card'}"
    env = dict(os.environ)
    env.update(
        {
            "TUNEBOX_DATA_DIR": str(data_dir),
            "TUNEBOX_MODEL_ROOTS": json.dumps(sorted({str(p.parent) for p in models})),
            "TUNEBOX_DATASET_ROOTS": json.dumps([str(data.parent)]),
            "TUNEBOX_PROGRESS_INTERVAL_S": "1",
            "TUNEBOX_WORKER_CONCURRENCY": "1",
            "PYTHONPATH": f"{REPO}:{env.get('PYTHONPATH', '')}",
        }
    )
    if limit_gib is not None:
        env["TUNEBOX_GPU_MEMORY_LIMIT_BYTES"] = str(int(limit_gib * GIB))
    for key in ("TUNEBOX_BROKER_URL", "TUNEBOX_DATABASE_URL"):
        env.pop(key, None)
    tunebox(env, "db", "upgrade")
    token = tunebox(env, "token", "create", "bench", "--admin").strip().splitlines()[0]
    port = free_port()
    log_path = work / f"serve-{limit_gib or 'card'}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunebox.cli", "serve", "--port", str(port)],
        env=env,
        cwd=REPO,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", timeout=120, headers={"Authorization": f"Bearer {token}"}
    )
    wait_ready(client, proc, 180, log_path)
    return proc, client, data_dir


def run_jobs(
    client: httpx.Client, data_dir: Path, bodies: list[dict[str, Any]], timeout: float
) -> dict[str, Any]:
    """Each job submitted and waited for in turn (one on the card at a time)."""
    out: dict[str, Any] = {}
    for body in bodies:
        resp = client.post("/v1/jobs", json=body)
        if resp.status_code != 201:
            out[body["name"]] = {"submit_status": resp.status_code, "refusal": resp.json()}
            continue
        jid = resp.json()["id"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if client.get(f"/v1/jobs/{jid}").json()["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(3)
        out[body["name"]] = result(client, jid, data_dir)
    return out




def phase_packing(work: Path, data: Path, steps: int, device: str, timeout: float) -> dict[str, Any]:
    model = build_model("qwen2.5-7b", work / "models" / "qwen2.5-7b", device)
    proc, client, data_dir = serve(work, [model], data, None)
    try:
        micro = 4
        jobs = run_jobs(
            client,
            data_dir,
            [
                spec("packed", model, data, steps, micro=micro, packing=True),
                spec("unpacked", model, data, steps, micro=micro, packing=False),
            ],
            timeout,
        )
    finally:
        stop_serve(proc)
    packed, unpacked = jobs.get("packed", {}), jobs.get("unpacked", {})
    rate = (packed.get("real_tokens_per_second") or 0) / (unpacked.get("real_tokens_per_second") or math.inf)
    return {
        "model": "qwen2.5-7b",
        "seq_len": 2048,
        "micro_batch_size": micro,
        "jobs": jobs,
        "packed_over_unpacked_real_tokens_per_second": round(rate, 3),
        "target": 1.8,
    }


def phase_chunked(work: Path, data: Path, steps: int, device: str, timeout: float) -> dict[str, Any]:
    model = build_model("llama-3.1-8b", work / "models" / "llama-3.1-8b", device)
    proc, client, data_dir = serve(work, [model], data, 24.0)
    try:
        chunked = spec("chunked-8b", model, data, steps, micro=2, packing=True, chunk=1024)
        full = spec("full-logits-8b", model, data, steps, micro=2, packing=True, chunk=None)
        planned_full = client.post("/v1/plans", json=full).json()
        jobs = run_jobs(client, data_dir, [chunked], timeout)
    finally:
        stop_serve(proc)
    return {
        "model": "llama-3.1-8b",
        "card_limit_bytes": 24 * GIB,
        "micro_batch_size": 2,
        "seq_len": 2048,
        "loss_chunk_tokens": 1024,
        "jobs": jobs,
        "plan_with_full_logits": {
            k: planned_full.get(k) for k in ("fits", "resolved", "per_gpu", "warnings")
        },
    }


PHASES = {"packing": phase_packing, "chunked": phase_chunked}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tunebox-datasets-bench"))
    ap.add_argument("--phase", action="append", choices=sorted(PHASES))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--device", default="cuda", help="cuda; cpu builds tiny models (a smoke test)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = build_dataset(args.work / "data" / "synthetic-alpaca.jsonl", args.rows)
    report: dict[str, Any] = {
        "dataset": {
            "rows": args.rows,
            "drawn_tokens": percentiles(row_lengths(args.rows)),
            "median": MEDIAN_TOKENS,
            "sigma": SIGMA,
            "range": [MIN_TOKENS, MAX_TOKENS],
        }
    }
    for name in args.phase or sorted(PHASES):
        started = time.monotonic()
        report[name] = PHASES[name](args.work, data, args.steps, args.device, args.timeout)
        report[name]["seconds"] = round(time.monotonic() - started, 1)
        args.out.write_text(json.dumps(report, indent=2))
    import torch

    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name(0)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "dataset"}, indent=2)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
