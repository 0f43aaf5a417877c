"""bench/field_cases runs a plan's alternatives as jobs: pinning one must give the job that alternative."""

from __future__ import annotations

import pytest

from bench.cases import MODELS
from bench.field_cases import AUTO, job, pin_alternative
from planner import plan

GIB = 2**30


@pytest.mark.parametrize(("model", "method", "limit_gib"),
                         [("qwen2.5-7b", "lora", 24), ("qwen2.5-7b", "qlora", 10),
                          ("qwen2.5-1.5b", "full", 40)])
def test_a_pinned_alternative_plans_as_that_alternative(model: str, method: str, limit_gib: int) -> None:
    spec = job("j", model, method, AUTO, accumulation=4)
    body = {**{k: v for k, v in spec.items() if k != "name"}, "model": {"config": dict(MODELS[model])},
            "hardware": {"gpu_count": 1, "gpu_memory_bytes": limit_gib * GIB, "host_memory_bytes": 125 * GIB}}
    auto = plan(body).model_dump(mode="json")
    assert len(auto["alternatives"]) >= 2  # a fitting plan or a refusal, each with its alternatives
    for k in (1, 2):
        alternative = auto["alternatives"][k - 1]
        pinned = plan(pin_alternative(body, auto, k))
        assert pinned.fits
        assert pinned.per_gpu.total_bytes == alternative["per_gpu_total_bytes"]
        assert pinned.estimated_tokens_per_second == pytest.approx(alternative["estimated_tokens_per_second"],
                                                                   rel=1e-3)
        assert pinned.per_gpu.total_bytes != auto["per_gpu"]["total_bytes"] or (
            pinned.resolved.model_dump(mode="json") != auto["resolved"])


def test_a_step_is_timed_from_one_progress_record_to_the_next_past_warm_up_and_checkpoints() -> None:
    from bench.service_gpu import steady_step_seconds

    times = {1: 10.0, 2: 11.0, 3: 11.5, 4: 12.0, 5: 14.0, 6: 14.6, 7: 15.2}  # step 5 wrote a checkpoint
    lines = [{"type": "progress", "step": s, "time": t, "tokens_per_second": 1.0} for s, t in times.items()]
    lines.insert(5, {"type": "checkpoint", "step": 5})
    # warm-up (steps 1-2) and the steps beside the checkpoint (5 and 6) are left out: 0.5, 0.5, 0.6
    assert steady_step_seconds(lines, skip=2) == pytest.approx(0.5)
    assert steady_step_seconds(lines[:2], skip=2) is None
