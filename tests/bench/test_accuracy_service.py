"""The accuracy report's service section and anchors (bench/accuracy_service.py)."""

from __future__ import annotations

import pytest

from bench.accuracy_service import (
    accelerate_estimate,
    anchors_section,
    breakdown_section,
    deepspeed_estimate,
    service_group,
    service_observations,
    service_section,
)
from planner import plan
from tests.planner.support import TINY_CONFIGS, hardware


def _plan(**resources: object) -> object:
    spec = {"model": {"config": TINY_CONFIGS["llama"]}, "method": "full", "hardware": hardware(gpus=2),
            "training": {"micro_batch_size": 1, "gradient_checkpointing": True},
            "resources": {"num_gpus": 2, "offload_param": "none", **resources}}
    return plan(spec)


def test_accelerates_rule_is_what_accelerate_prints() -> None:
    estimate = pytest.importorskip("accelerate.commands.estimate")
    p = _plan(zero_stage=0, offload_optimizer="none")
    fp32 = 4 * p.model.num_parameters  # type: ignore[attr-defined]
    assert accelerate_estimate(p) == max(estimate.estimate_training_usage(fp32, "bfloat16").values())  # type: ignore[arg-type]


@pytest.mark.parametrize(("stage", "offload", "expected"), [
    (2, "none", lambda n, big: 2 * n + 18 * n // 2),  # DeepSpeed's ZeRO-2 formula on two GPUs
    (2, "cpu", lambda n, big: 2 * n),
    (3, "none", lambda n, big: 4 * big + 18 * n // 2),
])
def test_deepspeeds_estimator_is_its_model_states_formula(stage: int, offload: str, expected: object) -> None:
    p = _plan(zero_stage=stage, offload_optimizer=offload)
    m = p.model  # type: ignore[attr-defined]
    largest = max(m.vocab_size * m.hidden_size, m.hidden_size * m.intermediate_size)
    assert deepspeed_estimate(p) == pytest.approx(expected(m.num_parameters, largest), abs=2)  # type: ignore[operator, arg-type]


def test_a_job_that_shaped_the_planner_is_in_sample() -> None:
    shaping = frozenset({"field-cases/a.json", "field-cases/b.json:p:shaped"})
    assert service_group("a:p:any", shaping) == "calibration"
    assert service_group("b:p:shaped", shaping) == "calibration"
    assert service_group("b:p:other", shaping) == "held-out"


def test_the_service_records_make_the_reports_sections() -> None:
    obs = service_observations()
    assert {o.group for o in obs} == {"calibration", "held-out"}
    assert {o.method for o in obs} >= {"lora", "qlora", "full"}
    # the anchors know neither adapters nor activations: on LoRA jobs DeepSpeed's misses, accelerate's
    # rule counts every parameter's Adam states
    lora = [o for o in obs if o.method == "lora"]
    assert max(o.accelerate for o in lora) > 1.0 and min(o.gpu for o in lora) > -0.1
    table = breakdown_section(obs)
    assert any(line.startswith("| method | qlora |") for line in table)
    anchors = anchors_section(obs)
    assert any("| service (" in line and "DeepSpeed's estimator" in line for line in anchors)
    # a box whose probe read its host faster than the calibration host's planned its steps shorter
    probed = [o for o in obs if o.step is not None and o.service_step != o.step]
    assert probed and all(o.service_step is not None for o in probed)
    assert any(o.service_step < o.step for o in probed) and any(o.service_step > o.step for o in probed)  # type: ignore[operator]
    lines = service_section(obs)
    assert sum(line.startswith("  - the same, as the service planned it") for line in lines) == 2
