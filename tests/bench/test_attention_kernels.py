"""bench/attention_kernels.py times the calls the trainer's attention makes; here, on the CPU, that
its masked call computes what the trainer's packed rows mean and its causal call what rows without a
mask mean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from bench.attention_kernels import calls, packed_mask  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_one_example_a_row_masks_as_the_causal_kernel_does() -> None:
    torch.manual_seed(0)
    c = calls(batch=2, seq=16, heads=4, kv_heads=2, head_dim=8, examples=1, device="cpu")
    assert torch.allclose(c["masked"](), c["causal"](), atol=1e-5)


def test_packed_examples_do_not_see_each_other() -> None:
    torch.manual_seed(0)
    mask = packed_mask(1, 12, 3, "cpu")[0, 0]
    assert mask[4, :4].sum() == 0 and mask[4, 4] and not mask[3, 4]  # the second example starts at 4
    c = calls(batch=1, seq=12, heads=4, kv_heads=2, head_dim=8, examples=3, device="cpu")
    q, k, v = c["inputs"]
    out = c["masked"]()
    # the first token of an example attends to itself alone: its output is its own value vector
    # (k/v head h // 2 serves query head h)
    for head in range(4):
        assert torch.allclose(out[0, head, 4], v[0, head // 2, 4], atol=1e-5)
        assert not torch.allclose(out[0, head, 5], v[0, head // 2, 5], atol=1e-3)


def test_the_script_writes_a_row_per_shape(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    subprocess.run([sys.executable, "-m", "bench.attention_kernels", "--out", str(out), "--device", "cpu",
                    "--model", "qwen2.5-0.5b", "--seq", "64", "128", "--batch", "1", "--repeats", "1"],
                   cwd=REPO, check=True, capture_output=True, timeout=300)
    report = json.loads(out.read_text())
    assert [(r["seq"], r["heads"], r["kv_heads"]) for r in report["rows"]] == [(64, 14, 2), (128, 14, 2)]
    assert all(r["masked_over_causal"] > 0 for r in report["rows"])
