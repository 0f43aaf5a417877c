"""Host terms too small for the records' +-10% band to see, each checked against its own evidence.

- The per-rank bookkeeping of ZeRO-3 parameter offload: what the calibration records with
  parameter offload hold beyond everything else the plan counts, per rank (its median).
- The weight file a ZeRO-3 ``from_pretrained`` holds at once when the checkpoint is not at hand:
  the hub's sharding convention, ``max_shard_size="5GB"``, that is 5 * 10**9 bytes.
"""

from __future__ import annotations

import statistics

import pytest

from bench.accuracy import planned_host
from planner import constants as C
from planner import plan
from tests.planner.test_records import CALIBRATION

GIB = 2**30


def _param_offload_rows() -> list:
    return [r for r in CALIBRATION if r.record["spec"]["resources"].get("offload_param") == "cpu"
            and r.measured("host_peak_rss_bytes")]


def test_parameter_offload_bookkeeping_is_what_the_records_leave_per_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _param_offload_rows()
    assert len(rows) >= 10
    term = C.HOST_PARAM_OFFLOAD_BYTES
    monkeypatch.setattr(C, "HOST_PARAM_OFFLOAD_BYTES", 0)
    left = []
    for row in rows:
        p = plan(row.record["spec"])
        left.append((row.measured("host_peak_rss_bytes") - planned_host(p)) / p.num_gpus)
    # the records leave -0.10..+0.21 GiB per rank; the term is their median, to a resolution
    # finer than the factor-of-two changes a mutation check makes
    assert statistics.median(left) == pytest.approx(term, abs=0.03 * GIB)


@pytest.mark.parametrize("num_gpus", [1, 2])
def test_zero3_loads_one_hub_sized_weight_file_per_rank(num_gpus: int) -> None:
    spec = {
        "model": {"name": "Qwen/Qwen2.5-7B"},  # 15 GB of bf16 weights, no files at hand
        "method": "lora",
        "training": {"micro_batch_size": 1, "gradient_accumulation_steps": 1, "seq_len": 1024,
                     "gradient_checkpointing": True, "max_steps": 10},
        "resources": {"num_gpus": num_gpus, "zero_stage": 3, "offload_optimizer": "none",
                      "offload_param": "none"},
        "eval": {"when": "none"},
        "hardware": {"gpu_count": num_gpus, "gpu_memory_bytes": 140 * GIB, "host_memory_bytes": 1024 * GIB},
    }
    assert plan(spec).host.model_load_bytes == num_gpus * 5 * 10**9
