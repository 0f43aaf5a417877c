"""What the evaluation process holds on its GPU against the plan's ``eval`` section.

Saves a random-init model of ``bench/cases.py``'s config (bf16, with the bench's tokenizer) as a
full-model checkpoint, writes a job folder as the trainer leaves one for the evaluator (``run.json``
and ``eval_split.jsonl``: ``--batch`` rows, each longer than ``--seq`` tokens), then runs the
evaluator's own steps (``worker.evaluate``): ``load_for_eval``, the eval loss of the split
(``eval_loss``: one batch of ``--batch`` rows of ``--seq`` tokens, no KV cache) and greedy answers to
every row (``generate_samples``: ``--new`` tokens after prompts cut to ``seq - new``). Prints one JSON
object: torch's allocated and reserved peaks of each phase, the process's NVML peak, and the plan's
figures for the same job. One configuration per process, so the NVML figure is the configuration's
own. Run from the repository root on a GPU box:
``python3 -m bench.eval_memory qwen2.5-1.5b --batch 8 --seq 2048 --new 64``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from bench.cases import H200_MEMORY_BYTES, MODELS


class _NvmlPeak(threading.Thread):
    """This process's peak NVML memory on GPU 0, sampled every 10 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import pynvml

        pynvml.nvmlInit()
        self.nvml, self.handle, self.peak = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0), 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if p.pid == os.getpid() and p.usedGpuMemory:
                    self.peak = max(self.peak, int(p.usedGpuMemory))
            self.done.wait(0.01)


def _spec(config: dict[str, Any], batch: int, seq: int, new: int) -> dict[str, Any]:
    return {
        "model": {"config": config},
        "method": "full",
        "training": {"micro_batch_size": 1, "seq_len": seq, "gradient_checkpointing": True},
        "resources": {"num_gpus": 1, "zero_stage": 3},
        "eval": {"batch_size": batch, "max_new_tokens": new, "num_samples": batch},
        "hardware": {"gpu_count": 1, "gpu_memory_bytes": H200_MEMORY_BYTES, "host_memory_bytes": 512 * 2**30},
    }


def planned(model: str, batch: int, seq: int, new: int,
            config: dict[str, Any] | None = None) -> dict[str, int]:
    from planner import plan

    spec = _spec(config or MODELS[model], batch, seq, new)
    return {k: v for k, v in plan(spec).eval.model_dump().items() if k.endswith("_bytes")}


def job_folder(config: dict[str, Any], batch: int, seq: int, new: int, work: Path) -> tuple[Path, Path]:
    """(the checkpoint, the job folder) the evaluator is given: a full model saved as a real one is
    (``bench.measure.model_folder``, in a child), and the run.json and eval split of a job that
    evaluates ``batch`` rows at ``seq`` tokens with ``new`` generated tokens."""
    from bench.measure import case_dataset, model_folder, write_run
    from planner import plan
    from tunebox.datasets import load_records
    from worker._trainlib.data import write_eval_split

    built = model_folder(config, work, limit_s=1800)
    if built.path is None:
        raise RuntimeError(built.error)
    data = case_dataset(work)
    spec = _spec(config, batch, seq, new)
    job = work / "job"
    write_run(job, "eval-memory", spec, built.path, data, plan(spec), {}, "cuda", None)
    fmt, rows = load_records(data)
    write_eval_split(job / "eval_split.jsonl", rows[:batch], fmt)
    return built.path, job


def measure(model_name: str, batch: int, seq: int, new: int, work: Path,
            config: dict[str, Any] | None = None) -> dict[str, Any]:
    config = config or MODELS[model_name]
    checkpoint, job = job_folder(config, batch, seq, new, work)  # before this process touches CUDA

    import torch

    from worker._trainlib.data import read_eval_split
    from worker._trainlib.runfile import load_run
    from worker.evaluate import eval_loss, generate_samples, load_for_eval

    cuda = torch.cuda.is_available()
    sampler = _NvmlPeak() if cuda else None
    if sampler is not None:
        sampler.start()
    run = load_run(job)
    device = "cuda" if cuda else "cpu"
    phases: dict[str, dict[str, int | None]] = {}

    def phase(name: str) -> None:
        if not cuda:
            phases[name] = {"allocated_peak_bytes": None, "reserved_peak_bytes": None}
            return
        torch.cuda.synchronize()
        phases[name] = {"allocated_peak_bytes": int(torch.cuda.max_memory_allocated()),
                        "reserved_peak_bytes": int(torch.cuda.max_memory_reserved())}
        torch.cuda.reset_peak_memory_stats()

    model, tokenizer = load_for_eval(run, checkpoint, device)
    phase("weights")
    generated: list[int] = []
    generate = model.generate

    def counted(*args: Any, **kwargs: Any) -> Any:  # how many tokens each generate call added
        out = generate(*args, **kwargs)
        generated.append(int(out.shape[1] - kwargs["input_ids"].shape[1]))
        return out

    model.generate = counted
    rows = read_eval_split(run.eval_split_path)
    with torch.inference_mode():
        loss, targets = eval_loss(model, tokenizer, rows, seq, batch, device)
        phase("eval_loss")
        samples = generate_samples(model, tokenizer, rows, run.spec, device)
        phase("generate")
    if sampler is not None:
        sampler.done.set()
        sampler.join()
    return {
        "model": model_name, "batch": batch, "seq": seq, "new": new,
        "generated": min(generated, default=0), "samples": len(samples), "loss_per_token": loss,
        "target_tokens": targets, "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "phases": phases, "nvml_peak_bytes": sampler.peak if sampler is not None else None,
        "planned": planned(model_name, batch, seq, new, config),
        "torch": torch.__version__, "gpu_name": torch.cuda.get_device_name(0) if cuda else None,
        "evaluator": "worker.evaluate",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--work", type=Path, default=Path("/tmp/tunebox-eval-memory"),
                        help="where the model folder and the job folder are written (models are kept)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.model, args.batch, args.seq, args.new, args.work)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
