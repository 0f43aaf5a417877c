"""The evaluation process: ``python -m worker.evaluate --job-dir DIR --checkpoint CKPT [--out FILE]``.

A process of its own, without DeepSpeed, so that generation's KV cache and activations can never
push the training run out of GPU memory. It loads the base model from ``run.json``'s
``model_path`` plus the adapter in ``CKPT`` (or the full model saved in ``CKPT``), measures eval
loss and perplexity on ``DIR/eval_split.jsonl`` with the training process's tokenisation and
masking, and generates ``spec.eval.num_samples`` answers greedily.

It writes ``FILE`` (default ``DIR/eval/<checkpoint name>.json``)::

    {"status": "ok", "pid", "checkpoint", "step", "eval_loss", "perplexity", "num_rows",
     "num_target_tokens", "samples": [{"prompt", "reference", "output"}], "peak_gpu_bytes",
     "host_peak_rss_bytes", "seconds"}

``eval_loss`` and ``perplexity`` are null when the split is empty. On failure it writes
``{"status": "failed", "kind", "reason", "message", "pid", "checkpoint"}`` and exits with the
training process's codes (1 error, 2 user_error, 3 cuda_oom, 4 host_oom, 5 disk_full).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from planner.constants import EVAL_LOSS_CHUNK_POSITIONS
from worker._trainlib.data import IGNORE, EvalRow, collate, encode, pad_id, read_eval_split, render_prompt
from worker._trainlib.progress import host_peak_rss_bytes
from worker._trainlib.runfile import (
    EXIT_OK,
    USER_ERROR,
    JobFailure,
    RunConfig,
    classify,
    load_run,
    write_json_atomic,
)


def _device(run: RunConfig) -> str:
    import torch

    return "cuda" if run.device == "cuda" and torch.cuda.is_available() else "cpu"


def load_for_eval(run: RunConfig, checkpoint: Path, device: str) -> tuple[Any, Any]:
    """``(model, tokenizer)``: base + adapter when the checkpoint holds one, else the full model."""
    from worker._trainlib import modeling

    if not checkpoint.is_dir():
        raise JobFailure(USER_ERROR, "bad_checkpoint", f"checkpoint folder not found: {checkpoint}")
    dtype = modeling.torch_dtype(run.resolved.precision, device)
    attn = modeling.attention_kwargs(run.resolved.attn_implementation)
    has_tokenizer = (checkpoint / "tokenizer_config.json").is_file()
    tokenizer = modeling.load_tokenizer(checkpoint if has_tokenizer else run.model_dir)
    if (checkpoint / "adapter_config.json").is_file():
        from peft import PeftModel

        base = modeling.load_causal_lm(run.model_dir, dtype, **attn)
        model = PeftModel.from_pretrained(base, str(checkpoint))
    else:
        model = modeling.load_causal_lm(checkpoint, dtype, **attn)
    return model.to(device).eval(), tokenizer


def eval_loss(model: Any, tokenizer: Any, rows: list[EvalRow], seq_len: int, batch_size: int,
              device: str) -> tuple[float | None, int]:
    """Token-weighted mean loss over the answer tokens of every row, and how many tokens that was."""
    import torch

    examples = [e for fmt, msgs in rows if (e := encode(tokenizer, msgs, fmt, seq_len)) is not None]
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        batch = collate(examples[start : start + batch_size], pad_id(tokenizer))
        t = {k: torch.tensor(v, dtype=torch.long, device=device) for k, v in batch.items()}
        logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], use_cache=False).logits
        summed, counted = summed_loss(logits, t["labels"])
        total += summed
        count += counted
    return (total / count if count else None), count


def summed_loss(logits: Any, labels: Any, chunk: int = EVAL_LOSS_CHUNK_POSITIONS) -> tuple[float, int]:
    """Summed cross-entropy of each position's logits against the next position's label, and how
    many labelled positions that was, ``chunk`` positions at a time: the whole batch's fp32 logits
    (4 bytes a position and vocabulary entry, and as much again for their log-softmax) would
    outgrow the model at long sequences and large vocabularies."""
    import torch

    vocab = logits.size(-1)
    targets = labels[:, 1:]
    total = 0.0
    positions = targets.size(1)  # the last position's logits predict nothing
    for i in range(0, positions, chunk):
        end = min(i + chunk, positions)
        part = logits[:, i:end].float()
        goal = targets[:, i:end]
        loss = torch.nn.functional.cross_entropy(part.reshape(-1, vocab), goal.reshape(-1),
                                                 ignore_index=IGNORE, reduction="sum")
        total += float(loss.item())
    return total, int((targets != IGNORE).sum().item())


def generate_samples(model: Any, tokenizer: Any, rows: list[EvalRow], spec: Any, device: str
                     ) -> list[dict[str, str]]:
    """Greedy answers to the first ``num_samples`` rows, ``batch_size`` prompts at a time."""

    chosen = [render_prompt(tokenizer, msgs, fmt) for fmt, msgs in rows[: spec.eval.num_samples]]
    if not chosen or spec.eval.max_new_tokens == 0:
        return [{"prompt": p, "reference": r, "output": ""} for p, r in chosen]
    tokenizer.padding_side = "left"  # generation continues from the right edge of every prompt
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    keep = max(1, spec.training.seq_len - spec.eval.max_new_tokens)
    out: list[dict[str, str]] = []
    for start in range(0, len(chosen), spec.eval.batch_size):
        part = chosen[start : start + spec.eval.batch_size]
        enc = tokenizer([p for p, _ in part], add_special_tokens=False, return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"][:, -keep:].to(device), enc["attention_mask"][:, -keep:].to(device)
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=spec.eval.max_new_tokens,
                             do_sample=False, pad_token_id=tokenizer.pad_token_id)
        for (prompt, reference), row in zip(part, gen[:, ids.shape[1]:], strict=True):
            out.append({"prompt": prompt, "reference": reference,
                        "output": tokenizer.decode(row, skip_special_tokens=True)})
    return out


def _step_of(checkpoint: Path) -> int | None:
    try:
        return int(json.loads((checkpoint / "trainer_state.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return None


def evaluate(run: RunConfig, checkpoint: Path) -> dict[str, Any]:
    import torch

    started = time.perf_counter()
    device = _device(run)
    model, tokenizer = load_for_eval(run, checkpoint, device)
    rows = read_eval_split(run.eval_split_path)
    spec = run.spec
    with torch.inference_mode():
        loss, targets = eval_loss(model, tokenizer, rows, spec.training.seq_len, spec.eval.batch_size, device)
        samples = generate_samples(model, tokenizer, rows, spec, device)
    return {
        "status": "ok", "pid": os.getpid(), "checkpoint": str(checkpoint), "step": _step_of(checkpoint),
        "eval_loss": loss, "perplexity": math.exp(loss) if loss is not None and loss < 700 else None,
        "num_rows": len(rows), "num_target_tokens": targets, "samples": samples,
        "peak_gpu_bytes": int(torch.cuda.max_memory_reserved()) if device == "cuda" else None,
        "host_peak_rss_bytes": host_peak_rss_bytes(), "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    job_dir, checkpoint = args.job_dir.resolve(), args.checkpoint.resolve()
    out = args.out or job_dir / "eval" / f"{checkpoint.name}.json"
    try:
        run = load_run(job_dir)
        if run.device == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        result, code = evaluate(run, checkpoint), EXIT_OK
    except Exception as exc:
        failure = classify(exc)
        traceback.print_exception(exc, file=sys.stderr)
        result = {"status": "failed", "kind": failure.kind, "reason": failure.reason,
                  "message": failure.message[:4000], "pid": os.getpid(), "checkpoint": str(checkpoint)}
        code = failure.exit_code
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, result)
    except OSError as exc:
        print(f"cannot write {out}: {exc}", file=sys.stderr)
        code = code or classify(exc).exit_code
    return code


if __name__ == "__main__":
    sys.exit(main())
