"""Phase peaks against the torch allocator peaks measured on an H200 (bench/results).

Each record carries torch's allocated peak of the forward/backward and of the optimizer step;
the planner's phase terms are arithmetic on DeepSpeed's buffers, with no fitted constant, so
they must agree closely: this pins the structure (which buffers exist at which peak).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.accuracy import as_run
from planner import plan

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "nvidia-h200-x2-2026-11-30.jsonl"
HELDOUT = ROOT / "bench" / "results" / "nvidia-h200-x2-2026-11-30-heldout.jsonl"
EVERY_FILE = sorted((ROOT / "bench" / "results").glob("nvidia-h200-x2-*.jsonl"))

#: Records whose allocated peak the phase model is known to miss, and by how much: each must still
#: miss (fix the model, then drop the line), every other record must agree.
KNOWN_ALLOCATED_MISSES = {
    # Phi-3 mini, ZeRO-3 optimizer offload, two GPUs: 0.4 GiB above the plan in backward, with
    # accumulation and without (a held-out configuration that repeated the miss)
    "phi-3-mini|full|z3|off=opt|ckpt|s2048|mb1|g2|gpus2": -0.049,
    "phi-3-mini|full|z3|off=opt|ckpt|s1024|mb2|g1|gpus2": -0.048,
    # the same shape on Llama 3 8B (heldout10): 0.46 GiB above the plan in backward
    "llama-3-8b|full|z3|off=opt|ckpt|s2048|mb1|g1|gpus2": -0.032,
    # Gemma 2 9B, ZeRO-3 optimizer offload, two GPUs (heldout10): its backward peaks 1.27 GiB below
    # the plan, which counts the gathered tied embedding (1.71 GiB) beside the 256k-vocabulary
    # loss blocks
    "gemma-2-9b|full|z3|off=opt|ckpt|s1024|mb1|g1|gpus2": 0.079,
    # and its LoRA run with parameter offload (heldout11): 0.6 GiB below the plan
    "gemma-2-9b|lora|z3|off=opt+param|ckpt|s2048|mb1|g1|gpus2": 0.058,
    # LoRA with ZeRO-3 parameter offload on two GPUs: 0.3 GiB above the plan
    "mistral-7b-v0.3|lora|z3|off=opt+param|ckpt|s2048|mb1|g1|gpus2": -0.066,
    # and at 2 x 1024 tokens (heldout21's two-GPU case, run on its own): the same 0.3 GiB
    "mistral-7b-v0.3|lora|z3|off=opt+param|ckpt|s1024|mb2|g1|gpus2": -0.066,
}


def _records(*paths: Path) -> list[dict[str, Any]]:
    """The records, each spec naming the attention and the rows its run used (``bench.accuracy.as_run``)."""
    lines = [line for path in paths or (RESULTS,) for line in path.read_text().splitlines()]
    return [as_run(json.loads(line)) for line in lines if line.strip()]


def _ran(*paths: Path) -> list[dict[str, Any]]:
    return [r for r in _records(*paths) if r["status"] == "ok"]


@pytest.mark.parametrize("record", _ran(RESULTS, HELDOUT), ids=lambda r: r["case"])
def test_phase_peaks_match_torch_allocated(record: dict[str, Any]) -> None:
    g = plan(record["spec"]).per_gpu
    peaks = record["measured"]["phase_peaks"]
    fb, step = peaks["forward_backward_allocated_peak"], peaks["optimizer_step_allocated_peak"]
    assert g.forward_backward_bytes == pytest.approx(fb, rel=0.045)
    assert g.optimizer_step_bytes == pytest.approx(step, rel=0.1)


def test_zero2_buckets_do_not_add_to_the_logits_peak() -> None:
    """ZeRO-2's ipg buckets are allocated at the first gradient, after the loss: on one GPU the
    forward/backward peak of ZeRO-0 and ZeRO-2 is the same (10.08 GiB in both records)."""
    by_case = {r["case"]: r for r in _records()}
    z0 = plan(by_case["qwen2.5-0.5b|full|z0|off=none|ckpt|s1024|mb2|g1"]["spec"]).per_gpu
    z2 = plan(by_case["qwen2.5-0.5b|full|z2|off=none|ckpt|s1024|mb2|g1"]["spec"]).per_gpu
    assert z0.forward_backward_bytes == z2.forward_backward_bytes
    assert z2.zero_buffers_bytes >= 2 * 500_000_000 * 2


@pytest.mark.parametrize("record", _ran(*EVERY_FILE), ids=lambda r: r["case"])
def test_allocated_peak_matches_every_record(record: dict[str, Any]) -> None:
    """The larger phase against torch's allocated peak over all steps (warm-up included), in every
    results file: within -3%/+5%, but for the named misses."""
    g = plan(record["spec"]).per_gpu
    measured = record["measured"]["torch_max_allocated_bytes"]
    error = max(g.forward_backward_bytes, g.optimizer_step_bytes, g.initialization_bytes) / measured - 1
    known = KNOWN_ALLOCATED_MISSES.get(record["case"])
    if known is None:
        assert -0.03 <= error <= 0.05
    else:
        assert error == pytest.approx(known, abs=0.01)
