"""The buffer lifetimes the planner's phases rest on, observed in the installed DeepSpeed (on the
CPU, one rank): which buffers a micro-step leaves for the next, the fp64 copy each offloaded
gradient's norm is taken of, and the gradients ZeRO-0's step holds without FusedAdam. A DeepSpeed
upgrade that changes them fails here, not on a GPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planner.memory import _gradients, _zero_buffers
from planner.setup import Setup, ZeroKnobs
from tests.planner.test_deepspeed import _facts

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def observed() -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=str(HERE.parents[1]))
    proc = subprocess.run([sys.executable, str(HERE / "ds_lifetimes.py"), str(port)], env=env,
                          capture_output=True, text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dict(json.loads(line.removeprefix("RESULT ")))


def _setup(stage: int, accumulation: int, bucket: int, optimizer: str = "adamw") -> Setup:
    return Setup(method="full", num_gpus=1, zero_stage=stage, offload_optimizer="none", offload_param="none",
                 micro_batch_size=2, gradient_accumulation_steps=accumulation, seq_len=16,
                 gradient_checkpointing=False, precision="bf16", optimizer=optimizer,
                 knobs=ZeroKnobs(reduce_bucket_size=bucket))


def test_zero1_holds_its_grads_and_both_buckets_until_the_boundary(observed: dict[str, Any]) -> None:
    first, boundary = observed["zero1"]
    bucket = observed["bucket_elements"]
    # after the first micro-step: two full-size buckets (overlap_comm) and every .grad
    assert first["buffers"] == [bucket, bucket] and first["grads"] == first["params"]
    # after the boundary's backward: the epilogue released the buckets and dropped the .grads
    assert boundary["buffers"] == [] and boundary["grads"] == 0
    # the planner holds the same into the next micro-step: the whole bf16 grads and both buckets
    facts, s = _facts("meta-llama/Llama-3.2-1B"), _setup(1, 2, bucket)
    assert _zero_buffers(facts, s, 2).accumulated == 2 * bucket * 2
    assert _gradients(facts, s, 2).accumulated == 2 * facts.trainable_parameters
    assert _zero_buffers(facts, _setup(1, 1, bucket), 2).accumulated == 0


def test_zero2_releases_its_buckets_after_every_backward(observed: dict[str, Any]) -> None:
    assert [m["buffers"] for m in observed["zero2"]] == [[], []]
    facts = _facts("meta-llama/Llama-3.2-1B")
    assert _zero_buffers(facts, _setup(2, 2, observed["bucket_elements"]), 2).accumulated == 0


@pytest.mark.parametrize("stage", [2, 3])
def test_offloaded_gradients_have_their_norms_taken_in_fp64(observed: dict[str, Any], stage: int) -> None:
    got = observed[f"zero{stage}_offload"]
    # one norm per parameter, each over an fp64 copy of its gradient's slice
    assert got["dtypes"] == ["torch.float64"] and got["norms"] == got["params"]


def test_zero0_without_fused_adam_upcasts_every_gradient_once_at_the_step(observed: dict[str, Any]) -> None:
    got = observed["zero0_sgd"]
    # bf16 ZeRO-0 wraps an optimizer other than FusedAdam in FP16_UnfusedOptimizer, whose step
    # holds one fp32 copy of every gradient beside the bf16 ones
    assert got["wrapper"] == "FP16_UnfusedOptimizer"
    assert got["fp32_grad_elements"] == got["bf16_grad_elements"] == got["params"]
    facts = _facts("meta-llama/Llama-3.2-1B")
    t = facts.trainable_parameters
    assert _gradients(facts, _setup(0, 1, observed["bucket_elements"], "sgd"), 2).step == (2 + 4) * t
