"""The DeepSpeed config the harness builds is what the service runs and what DeepSpeed accepts."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bench.cases import CASES, Case, make_case
from bench.measure import build_ds_config


@pytest.fixture()
def ds_world(monkeypatch: pytest.MonkeyPatch) -> Any:
    """DeepSpeedConfig checks train_batch_size against the world size it reads from deepspeed.comm."""
    import deepspeed.runtime.config as ds_runtime_config

    def set_world(n: int) -> None:
        monkeypatch.setattr(ds_runtime_config.dist, "get_rank", lambda *a, **k: 0)
        monkeypatch.setattr(ds_runtime_config.dist, "get_world_size", lambda *a, **k: n)

    return set_world


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_deepspeed_accepts_the_config(case: Case, ds_world: Any) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    cfg = build_ds_config(case.spec)
    ds_world(case.num_gpus)
    parsed = DeepSpeedConfig(copy.deepcopy(cfg))
    zero = DeepSpeedZeroConfig(**cfg["zero_optimization"])
    res = case.spec["resources"]
    assert parsed.zero_optimization_stage == res["zero_stage"] == zero.stage
    assert parsed.train_batch_size == case.spec["training"]["micro_batch_size"] * \
        case.spec["training"]["gradient_accumulation_steps"] * case.num_gpus
    assert parsed.bfloat16_config.enabled
    assert parsed.gradient_clipping == 1.0
    assert parsed.optimizer_name == "adamw"
    assert (zero.offload_optimizer is not None) == (res["offload_optimizer"] == "cpu")
    assert (zero.offload_param is not None) == (res["offload_param"] == "cpu")
    if zero.offload_optimizer is not None:
        assert zero.offload_optimizer.device == "cpu" and zero.offload_optimizer.pin_memory


def test_the_harness_runs_the_plans_own_config() -> None:
    from planner import plan

    spec = make_case("qwen2.5-0.5b", "full", 3, "opt+param", True, 1024, 2, 4).spec
    cfg = build_ds_config(spec)
    assert cfg == plan(spec).deepspeed_config  # one builder: the service's
    assert cfg["train_micro_batch_size_per_gpu"] == 2
    assert cfg["gradient_accumulation_steps"] == 4
    assert cfg["train_batch_size"] == 8
    assert cfg["optimizer"]["type"] == "AdamW"
    assert cfg["zero_force_ds_cpu_optimizer"] is False  # the optimizer is offloaded
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    for knob, value in spec["resources"]["deepspeed"].items():  # the case's pinned knobs
        assert zero[knob] == value


def test_stage2_and_stage0_sections() -> None:
    z2 = build_ds_config(make_case("qwen2.5-0.5b", "full", 2, "opt", True, 1024, 2, 1, gpus=2).spec)
    assert z2["train_batch_size"] == 4
    assert z2["zero_optimization"]["allgather_bucket_size"] == 5e8
    assert "offload_param" not in z2["zero_optimization"]
    assert not any(k.startswith("stage3_") for k in z2["zero_optimization"])
    z0 = build_ds_config(make_case("qwen2.5-0.5b", "full", 0, "none", True, 1024, 2, 1).spec)
    assert z0["zero_optimization"] == {"stage": 0}


def test_resources_deepspeed_overrides_a_knob() -> None:
    spec = make_case("qwen2.5-0.5b", "full", 3, "none", True, 1024, 2, 1).spec
    spec["resources"]["deepspeed"] = {**spec["resources"]["deepspeed"], "reduce_bucket_size": 2e8,
                                      "stage3_max_live_parameters": 3e8}
    zero = build_ds_config(spec)["zero_optimization"]
    assert zero["reduce_bucket_size"] == 2e8 and zero["stage3_max_live_parameters"] == 3e8
    assert zero["stage3_prefetch_bucket_size"] == 5e8


@pytest.mark.parametrize(("path", "value", "match"), [
    (("training", "micro_batch_size"), "auto", "micro_batch_size"),
    (("resources", "zero_stage"), "auto", "zero_stage"),
    (("resources", "offload_optimizer"), "nvme", "NVMe"),
])
def test_concrete_values_are_required(path: tuple[str, str], value: Any, match: str) -> None:
    spec = make_case("qwen2.5-0.5b", "full", 3, "none", True, 1024, 2, 1).spec
    spec[path[0]][path[1]] = value
    with pytest.raises(ValueError, match=match):
        build_ds_config(spec)


def test_offload_is_refused_where_deepspeed_cannot_do_it() -> None:
    spec = make_case("qwen2.5-0.5b", "full", 0, "none", True, 1024, 2, 1).spec
    spec["resources"]["offload_optimizer"] = "cpu"
    with pytest.raises(ValueError, match="stage 1-3"):
        build_ds_config(spec)
    spec = make_case("qwen2.5-0.5b", "full", 2, "none", True, 1024, 2, 1).spec
    spec["resources"]["offload_param"] = "cpu"
    with pytest.raises(ValueError, match="ZeRO-3"):
        build_ds_config(spec)
