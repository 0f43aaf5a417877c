"""The whole service on a GPU box, against the same training launched by hand.

Builds two random-init Qwen2.5-shaped model folders (1.5B and 0.5B, a locally trained tokenizer) and
a long-row alpaca dataset, starts ``tunebox serve`` on its embedded default (SQLite, the filesystem
broker, one worker beside the API), submits through the REST API

- A: LoRA on the 1.5B model, ZeRO-3 with optimizer and parameter offload to the CPU, evaluation at
  the end in its own process;
- B: full fine-tuning of the 0.5B model, ZeRO-3 without offload;

waits for both, then runs the very same ``run.json`` of each job by hand under the ``deepspeed``
launcher, and writes one JSON report: status history, loss curve, measured peak GPU memory and host
RSS against the plan, tokens/s of the service and of the hand run, and their ratio.

    python3 -m bench.service_gpu --out report.json [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.cases import MODELS, hf_config

REPO = Path(__file__).resolve().parents[1]
WORDS = (  # noqa: SIM905 - one readable line of words
    "river stone light garden paper window silver market winter orange signal harbor "
    "forest engine bridge candle thunder meadow rocket velvet copper island mirror shadow "
    "lantern canyon breeze marble falcon ember glacier harvest needle orbit pillar quartz "
    "ribbon saddle timber violet walnut yonder zephyr anchor basket cobalt dune feather").split()


def build_tokenizer(dest: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(200)]
    corpus.append("### Instruction: ### Response: Continue the sequence.")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(dest)
    return fast


TINY = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512, "max_position_embeddings": 4096, "tie_word_embeddings": True}


def stop_serve(proc: Any, timeout: float = 60) -> None:
    """Stop a ``tunebox serve`` process: SIGTERM (its worker stops its runs), then SIGKILL."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def build_model(name: str, dest: Path, device: str) -> Path:
    """A random-init model of ``name``'s published architecture (a tiny one on the CPU), saved in
    bf16 like a real one (kept where an earlier run on this machine saved it)."""
    return save_random_model(dict(TINY if device == "cpu" else MODELS[name]), dest, device)


def is_saved_model(dest: Path) -> bool:
    return (dest / "config.json").exists() and any(dest.glob("*.safetensors"))


def save_random_model(config: dict[str, Any], dest: Path, device: str) -> Path:
    """A random-init model of ``config`` built on ``device`` with the bench's tokenizer, saved in bf16
    to ``dest`` (kept where an earlier run on this machine saved it)."""
    if is_saved_model(dest):
        return dest
    import torch
    from transformers import AutoModelForCausalLM

    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(dest)
    raw = dict(config)
    raw.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(raw), dtype=torch.bfloat16)
    model.save_pretrained(dest)
    del model
    torch.cuda.empty_cache()
    return dest


def build_dataset(path: Path, rows: int, words: int) -> Path:
    rng = random.Random(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for _ in range(rows):
            seed = [rng.choice(WORDS) for _ in range(4)]
            text = " ".join(seed[i % 4] for i in range(words))  # a learnable repeating pattern
            f.write(json.dumps({"instruction": "Continue the sequence.", "input": " ".join(seed),
                                "output": text}) + "\n")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tunebox(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "tunebox.cli", *args], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True)
    return out.stdout


def wait_ready(client: httpx.Client, serve: subprocess.Popen[bytes], seconds: float, log: Path) -> None:
    """Until ``tunebox serve`` answers ``/readyz`` ready (or ``seconds`` pass); fails if it exited."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if serve.poll() is not None:
            raise RuntimeError(f"tunebox serve exited {serve.returncode}: see {log}")
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)


def job_spec(name: str, model: Path, data: Path, method: str, offload: str, steps: int,
             seq_len: int, micro: int) -> dict[str, Any]:
    return {
        "name": name, "model": {"path": str(model)},
        "dataset": {"path": str(data), "format": "alpaca", "eval_fraction": 0.02},
        "method": method,
        "lora": {"r": 16, "alpha": 32, "dropout": 0.05,
                 "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "training": {"max_steps": steps, "epochs": None, "learning_rate": 2e-4 if method == "lora" else 2e-5,
                     "lr_scheduler": "cosine", "warmup_ratio": 0.05, "micro_batch_size": micro,
                     "gradient_accumulation_steps": 1, "seq_len": seq_len, "gradient_checkpointing": True,
                     "precision": "bf16", "save_steps": steps // 2, "seed": 42},
        "resources": {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": offload, "offload_param": offload},
        "eval": {"when": "end", "max_new_tokens": 64, "batch_size": 1, "num_samples": 4},
    }


def progress_lines(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "progress.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def archived_progress(logs: Path) -> dict[str, list[dict[str, Any]]]:
    """The progress lines of every job folder in an archive of a bench's work folder (its
    ``-logs.tgz``), by job id."""
    import tarfile

    out: dict[str, list[dict[str, Any]]] = {}
    with tarfile.open(logs) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if member.isfile() and parts[-1] == "progress.jsonl" and len(parts) >= 3 and parts[-3] == "jobs":
                fh = tar.extractfile(member)
                raw = fh.read().decode() if fh is not None else ""
                out[parts[-2]] = [json.loads(line) for line in raw.splitlines() if line.strip()]
    return out


def steady_tokens_per_second(lines: list[dict[str, Any]], skip: int = 3) -> float | None:
    """Median tokens/s over the steps after warm-up, leaving out steps that wrote a checkpoint."""
    ckpt_steps = {ln["step"] for ln in lines if ln["type"] == "checkpoint"}
    rates = [ln["tokens_per_second"] for ln in lines if ln["type"] == "progress"
             and ln["step"] > skip and ln["step"] - 1 not in ckpt_steps and ln["step"] not in ckpt_steps]
    return statistics.median(rates) if rates else None


def steady_step_seconds(lines: list[dict[str, Any]], skip: int = 2) -> float | None:
    """Median wall seconds of one optimizer step after warm-up (from one progress line to the next),
    leaving out steps that wrote a checkpoint. Unlike tokens/s, which counts real tokens only, it is
    the time of the whole step, padding included (a packed row a long example leaves part-empty)."""
    progress = [ln for ln in lines if ln["type"] == "progress"]
    ckpt_steps = {ln["step"] for ln in lines if ln["type"] == "checkpoint"}
    gaps = [b["time"] - a["time"] for a, b in zip(progress, progress[1:], strict=False)
            if b["step"] > skip and b["step"] == a["step"] + 1 and not {a["step"], b["step"]} & ckpt_steps]
    return statistics.median(gaps) if gaps else None


def steady_steps_per_second(lines: list[dict[str, Any]], skip: int = 2) -> float | None:
    """Optimizer steps per second of wall time after warm-up, checkpoint saves included: the rate
    a user sees, less sensitive to one slow step than the per-step median."""
    times = [ln["time"] for ln in lines if ln["type"] == "progress" and ln["step"] > skip]
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def wait_jobs(client: httpx.Client, ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        jobs = {i: client.get(f"/v1/jobs/{i}").json() for i in ids}
        if all(j["status"] in ("succeeded", "failed", "cancelled") for j in jobs.values()):
            return jobs
        if time.monotonic() > deadline:
            return jobs
        time.sleep(2)


def run_figures(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """What one run's progress file says: its NVML peak and its steady rates."""
    return {"nvml_peak_bytes": max((ln.get("nvml_peak_bytes") or 0 for ln in lines), default=None),
            "steady_tokens_per_second": steady_tokens_per_second(lines),
            "steady_steps_per_second": steady_steps_per_second(lines)}


def collect(client: httpx.Client, job: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    jid = job["id"]
    events = client.get(f"/v1/jobs/{jid}/events", params={"limit": 1000}).json()["items"]
    points = client.get(f"/v1/jobs/{jid}/metrics").json()["points"]
    lines = progress_lines(data_dir / "jobs" / jid)
    return {
        "job": job,
        "status_history": [(e["created_at"], e["data"]["to"]) for e in events if e["kind"] == "status"],
        "loss_curve": [(p["step"], p["loss"]) for p in sorted(points, key=lambda p: p["step"])],
        "torch_peak_reserved_bytes": max((ln.get("peak_gpu_bytes") or 0 for ln in lines), default=None),
        **run_figures(lines),
    }


def overhead(job: dict[str, Any]) -> dict[str, Any]:
    """The service's rates over the mean of the hand runs', and how far the hand runs spread."""
    out: dict[str, Any] = {}
    for metric in ("steady_tokens_per_second", "steady_steps_per_second"):
        hand = [h[metric] for h in job["hand_runs"] if h.get(metric)]
        if not hand or not job.get(metric):
            continue
        mean = statistics.fmean(hand)
        out[metric] = {"service": job[metric], "hand": hand,
                       "service_over_hand": round(job[metric] / mean, 4),
                       "hand_spread": round((max(hand) - min(hand)) / mean, 4)}
    return out


def hand_run(job_dir: Path, dest: Path, gpu: int | None) -> subprocess.Popen[bytes]:
    """The job's own run.json, launched by hand with the ``deepspeed`` launcher on one GPU."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copy(job_dir / "run.json", dest / "run.json")
    include = [] if gpu is None else ["--include", f"localhost:{gpu}"]
    argv = [sys.executable, "-m", "deepspeed.launcher.runner", *include,
            "--master_port", str(free_port()), "--module", "worker.train", "--job-dir", str(dest)]
    log = (dest / "train.log").open("wb")
    return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tunebox-service-bench"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=360)
    ap.add_argument("--hand-rounds", type=int, default=2,
                    help="how often the hand runs are repeated (their spread is the noise of the ratio)")
    ap.add_argument("--sequential", action="store_true",
                    help="one job at a time, in the service and by hand: the ratio then measures the "
                    "service, not how the two jobs' phases happened to overlap")
    ap.add_argument("--jobs", default="lora,full", help="which of the two jobs to run: lora, full or both")
    ap.add_argument("--tiny", action="store_true", help="tiny models on the CPU: a smoke test of this script")
    args = ap.parse_args()
    wanted = {j.strip() for j in args.jobs.split(",") if j.strip()}
    if not wanted or not wanted <= {"lora", "full"}:
        ap.error("--jobs takes lora, full or lora,full")
    device = "cpu" if args.tiny else "cuda"
    t0 = time.monotonic()
    work = args.work
    models, datasets, data_dir = work / "models", work / "data", work / "tunebox"
    m15 = build_model("qwen2.5-1.5b", models / "qwen2.5-1.5b-random", device) if "lora" in wanted else None
    m05 = build_model("qwen2.5-0.5b", models / "qwen2.5-0.5b-random", device) if "full" in wanted else None
    data = build_dataset(datasets / "pattern.jsonl", rows=args.steps * args.micro_batch * 2,
                         words=args.seq_len)
    report: dict[str, Any] = {"setup_seconds": round(time.monotonic() - t0, 1), "sequential": args.sequential,
                              "steps": args.steps, "seq_len": args.seq_len, "micro_batch": args.micro_batch}

    env = dict(os.environ)
    env.update({
        "TUNEBOX_DATA_DIR": str(data_dir), "TUNEBOX_MODEL_ROOTS": json.dumps([str(models)]),
        "TUNEBOX_DATASET_ROOTS": json.dumps([str(datasets)]),
        "TUNEBOX_WORKER_CONCURRENCY": "1" if args.sequential else "2",
        "TUNEBOX_PROGRESS_INTERVAL_S": "1", "PYTHONPATH": f"{REPO}:{env.get('PYTHONPATH', '')}",
    })
    if args.tiny:  # the CPU stands in for two GPUs
        env.update({"DS_ACCELERATOR": "cpu", "TUNEBOX_GPU_COUNT": "2",
                    "TUNEBOX_GPU_MEMORY_BYTES": str(24 * 2**30)})
    env.pop("TUNEBOX_BROKER_URL", None)
    env.pop("TUNEBOX_DATABASE_URL", None)
    tunebox(env, "db", "upgrade")
    token = tunebox(env, "token", "create", "bench", "--admin").strip().splitlines()[0]
    port = free_port()
    serve_log = (work / "serve.log").open("wb")
    serve = subprocess.Popen([sys.executable, "-m", "tunebox.cli", "serve", "--port", str(port)],
                             env=env, cwd=REPO, stdout=serve_log, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          headers={"Authorization": f"Bearer {token}"})
    try:
        wait_ready(client, serve, 60, work / "serve.log")
        specs = {}
        if m15 is not None:
            specs["lora_1.5b_z3_offload"] = job_spec("lora-1.5b-z3-offload", m15, data, "lora", "cpu",
                                                     args.steps, args.seq_len, args.micro_batch)
        if m05 is not None:
            offload = "cpu" if args.tiny else "none"
            specs["full_0.5b_z3"] = job_spec("full-0.5b-z3", m05, data, "full", offload, args.steps,
                                             args.seq_len, args.micro_batch)
        ids: dict[str, str] = {}
        for key, body in specs.items():
            resp = client.post("/v1/jobs", json=body)
            if resp.status_code != 201:
                report[key] = {"submit_error": resp.json()}
                continue
            ids[key] = resp.json()["id"]
            report[key] = {"plan": resp.json().get("plan")}
        jobs = wait_jobs(client, list(ids.values()), args.timeout)
        for key, jid in ids.items():
            report[key].update(collect(client, jobs[jid], data_dir))
        report["gpus"] = client.get("/v1/gpus").json()
    finally:
        stop_serve(serve)
    report["service_seconds"] = round(time.monotonic() - t0, 1)
    args.out.write_text(json.dumps(report, indent=1, default=str))  # kept if the hand runs do not finish

    # the same runs by hand, as the service ran them (both at once, one GPU each, or one after the
    # other), ``--hand-rounds`` times
    for key in ids:
        report[key]["hand_runs"] = []
    for _ in range(args.hand_rounds):
        batches = [[key] for key in ids] if args.sequential else [list(ids)]
        for batch in batches:
            hands = {key: (hand_run(data_dir / "jobs" / ids[key], work / "hand" / key,
                                    None if args.tiny else (0 if args.sequential else gpu)),
                           work / "hand" / key)
                     for gpu, key in enumerate(batch)}
            for key, (proc, dest) in hands.items():
                code = proc.wait(timeout=args.timeout)
                report[key]["hand_runs"].append({"exit_code": code, **run_figures(progress_lines(dest))})
                report[key]["overhead"] = overhead(report[key])
                # after every hand run: a time limit that stops the next one keeps this one's figures
                args.out.write_text(json.dumps(report, indent=1, default=str))
    report["total_seconds"] = round(time.monotonic() - t0, 1)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    for key in ids:
        r = report[key]
        job = r["job"]
        print(f"{key}: {job['status']} planned {job['planned_peak_gpu_bytes']} measured "
              f"{job['progress'].get('measured_peak_gpu_bytes')} nvml {r['nvml_peak_bytes']} "
              f"tok/s {r['steady_tokens_per_second']} steps/s {r['steady_steps_per_second']} "
              f"overhead {r.get('overhead')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
