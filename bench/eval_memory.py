"""What the evaluation process holds on its GPU against the plan's ``eval`` section.

Builds a model of ``bench/cases.py`` from its config (random weights, bf16, on the GPU), then does
what ``worker/evaluate.py`` does with a checkpoint: the eval loss of ``--batch`` rows of ``--seq``
tokens (``summed_loss``, no KV cache), then greedy generation of ``--new`` tokens from ``--batch``
prompts of ``seq - new`` tokens. Prints one JSON object: torch's allocated and reserved peaks of
each phase, the process's NVML peak, and the plan's figures for the same job. One configuration
per process, so the NVML figure is the configuration's own. Run from the repository root on a GPU
box: ``python3 -m bench.eval_memory qwen2.5-1.5b --batch 8 --seq 2048 --new 64``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from bench.cases import H200_MEMORY_BYTES, MODELS, hf_config


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


def planned(model: str, batch: int, seq: int, new: int) -> dict[str, int]:
    from planner import plan

    spec = {
        "model": {"config": MODELS[model]},
        "method": "full",
        "training": {"micro_batch_size": 1, "seq_len": seq, "gradient_checkpointing": True},
        "resources": {"num_gpus": 1, "zero_stage": 3},
        "eval": {"batch_size": batch, "max_new_tokens": new},
        "hardware": {"gpu_count": 1, "gpu_memory_bytes": H200_MEMORY_BYTES, "host_memory_bytes": 512 * 2**30},
    }
    return {k: v for k, v in plan(spec).eval.model_dump().items() if k.endswith("_bytes")}


def measure(model_name: str, batch: int, seq: int, new: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from worker._trainlib.data import IGNORE
    from worker.evaluate import summed_loss

    sampler = _NvmlPeak()
    sampler.start()
    config = hf_config(MODELS[model_name])
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    vocab = int(config.vocab_size)
    phases: dict[str, dict[str, int]] = {}

    def phase(name: str) -> None:
        torch.cuda.synchronize()
        phases[name] = {"allocated_peak_bytes": int(torch.cuda.max_memory_allocated()),
                        "reserved_peak_bytes": int(torch.cuda.max_memory_reserved())}
        torch.cuda.reset_peak_memory_stats()

    phase("weights")
    with torch.inference_mode():
        ids = torch.randint(0, vocab, (batch, seq), device="cuda")
        labels = ids.clone()
        labels[:, : seq // 4] = IGNORE  # a prompt's share carries no loss, as in the eval split
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
        loss, count = summed_loss(logits, labels)
        del logits, ids, labels
        phase("eval_loss")
        prompt = torch.randint(0, vocab, (batch, max(1, seq - new)), device="cuda")
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, pad_token_id=0)
        phase("generate")
    sampler.done.set()
    sampler.join()
    return {
        "model": model_name, "batch": batch, "seq": seq, "new": new,
        "generated": int(out.shape[1] - prompt.shape[1]), "loss_per_token": loss / count,
        "attn_implementation": getattr(config, "_attn_implementation", None), "phases": phases,
        "nvml_peak_bytes": sampler.peak, "planned": planned(model_name, batch, seq, new),
        "torch": torch.__version__, "gpu_name": torch.cuda.get_device_name(0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.model, args.batch, args.seq, args.new)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
