"""The search: the fastest configuration that fits, monotonic in every capacity; refusals whose
alternatives each fit; advice that never proposes what the plan already has.

The property tests sample (model, method, budget) cases with a fixed seed over the whole
catalogue, all three methods, 8-160 GiB cards and 1-8 GPUs, and check each claim against an
independent computation: a brute-force enumeration of the same space, or the plan of the spec
an alternative describes.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from planner import Plan, PlanError, plan
from planner.catalogue import catalogue
from planner.core import _base_setup, _choices, prepare
from planner.search import evaluate, points
from tests.planner.support import GIB, hardware

MODELS = sorted(catalogue())
METHODS = ("lora", "qlora", "full")
GPU_GIB = (8, 10, 16, 24, 32, 40, 48, 64, 80, 96, 141, 160)
SEED = 21


def auto_spec(model: str, method: str, gpu_gib: float, gpus: int = 1, host_gib: int = 256,
              seq_len: int = 1024, accumulation: int = 16) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": model},
        "method": method,
        "training": {"seq_len": seq_len, "gradient_accumulation_steps": accumulation},
        "hardware": hardware(gpus=gpus, gpu_bytes=int(gpu_gib * GIB), host_gib=host_gib),
    }
    if "Phi-3" in model:  # fused projections
        spec["lora"] = {"target_modules": ["qkv_proj", "o_proj"]}
    return spec


def _cases(n: int) -> list[tuple[str, str, int, int, int]]:
    rng = random.Random(SEED)
    out = []
    for i in range(n):
        model = MODELS[i % len(MODELS)]  # every model, then again
        out.append((model, rng.choice(METHODS), rng.choice(GPU_GIB[:-1]), rng.choice((1, 2, 4, 8)),
                    rng.choice((32, 64, 128, 256))))
    return out


CASES = _cases(100)


def speed(p: Plan) -> float:
    return p.estimated_tokens_per_second if p.fits else 0.0


def test_the_cases_cover_the_catalogue_and_every_method() -> None:
    assert len(MODELS) >= 20
    assert {c[0] for c in CASES} == set(MODELS)
    assert {c[1] for c in CASES} == set(METHODS)


@pytest.mark.parametrize(("model", "method", "gib", "gpus", "host"), CASES[::2])
def test_more_capacity_never_gives_a_slower_plan(model: str, method: str, gib: int, gpus: int,
                                                 host: int) -> None:
    base = plan(auto_spec(model, method, gib, gpus, host))
    bigger = GPU_GIB[GPU_GIB.index(gib) + 1]
    for grown in (auto_spec(model, method, bigger, gpus, host),
                  auto_spec(model, method, gib, min(8, gpus * 2), host),
                  auto_spec(model, method, gib, gpus, host * 2)):
        more = plan(grown)
        assert speed(more) >= speed(base), (grown["hardware"], base.resolved, more.resolved)


@pytest.mark.parametrize(("model", "method", "gpu_gib"), [
    ("Qwen/Qwen2.5-1.5B", "full", (32, 40)),  # the issue's counterexamples
    ("Qwen/Qwen2.5-3B", "full", (48, 64)),
])
def test_the_issues_counterexamples_are_monotonic(model: str, method: str, gpu_gib: tuple[int, int]) -> None:
    small, large = (plan(auto_spec(model, method, g)) for g in gpu_gib)
    assert small.fits and large.fits
    assert large.estimated_tokens_per_second >= small.estimated_tokens_per_second


@pytest.mark.parametrize(("model", "method", "gib", "gpus", "host"), CASES[1::4])
def test_the_choice_is_the_fastest_fitting_point_of_the_whole_space(model: str, method: str, gib: int,
                                                                    gpus: int, host: int) -> None:
    spec = auto_spec(model, method, gib, gpus, host)
    p = prepare(spec)
    base = _base_setup(p)
    choices, _ = _choices(p, base)
    every = [evaluate(p.facts, s, p.bounds, p.rates) for s, _ in points(base, choices)]
    fitting = [c for c in every if c.fits]
    result = plan(spec)
    assert result.fits == bool(fitting)
    if fitting:
        best = max(c.speed.tokens_per_second for c in fitting)
        assert result.estimated_tokens_per_second == pytest.approx(best, rel=1e-6, abs=1e-3)


def _as_pinned(spec: dict[str, Any], p: Plan, changes: dict[str, Any]) -> dict[str, Any]:
    """The fully pinned spec of the plan's configuration with ``changes`` applied."""
    out = copy.deepcopy(spec)
    r = p.resolved
    out["method"] = r.method
    out["training"].update(seq_len=r.seq_len, micro_batch_size=r.micro_batch_size,
                           gradient_accumulation_steps=r.gradient_accumulation_steps,
                           gradient_checkpointing=r.gradient_checkpointing)
    zero = p.deepspeed_config["zero_optimization"]
    knobs = {k: zero[k] for k in ("reduce_bucket_size", "stage3_prefetch_bucket_size",
                                  "stage3_max_live_parameters", "stage3_max_reuse_distance",
                                  "sub_group_size") if k in zero}
    out["resources"] = {"num_gpus": r.num_gpus, "zero_stage": r.zero_stage,
                        "offload_optimizer": r.offload_optimizer, "offload_param": r.offload_param,
                        "deepspeed": knobs}
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    if out["resources"]["zero_stage"] == 0:
        out["resources"]["deepspeed"] = {}
    elif out["resources"]["zero_stage"] != 3:
        out["resources"]["deepspeed"] = {k: v for k, v in out["resources"]["deepspeed"].items()
                                         if not k.startswith("stage3_")}
    return out


def _check_alternatives(spec: dict[str, Any], p: Plan) -> None:
    for a in p.alternatives:
        assert a.fits and a.changes
        assert ("method" in a.changes) == (a.kind == "method_change")
        again = plan(_as_pinned(spec, p, a.changes))
        assert again.fits, (a.changes, again.per_gpu.required_bytes, again.host.total_bytes)
        assert again.estimated_tokens_per_second == pytest.approx(a.estimated_tokens_per_second, rel=1e-4)
        assert "GiB" in a.reason
    speeds = [a.estimated_tokens_per_second for a in p.alternatives]
    assert speeds == sorted(speeds, reverse=True)


def _current(p: Plan, spec: dict[str, Any], field: str) -> Any:
    r = p.resolved.model_dump()
    leaf = field.split(".")[-1]
    if field.startswith(("training.", "resources.")) and leaf in r:
        return r[leaf]
    if field.startswith("resources.deepspeed."):
        return p.deepspeed_config["zero_optimization"].get(leaf)
    if field == "eval.batch_size":
        return p.eval.batch_size
    raise AssertionError(f"advice names a field the test does not know: {field}")


def _check_advice(spec: dict[str, Any], p: Plan) -> None:
    for note in p.advice:
        assert note.field
        if note.value is None:
            continue
        assert note.value != _current(p, spec, note.field), note
        assert note.saves_bytes is not None and note.saves_bytes > 0 or note.saves_seconds, note
        assert "GiB" in note.message or " s" in note.message


@pytest.mark.parametrize(("model", "method", "gib", "gpus", "host"), CASES)
def test_every_alternative_fits_and_no_advice_repeats_the_plan(model: str, method: str, gib: int,
                                                               gpus: int, host: int) -> None:
    spec = auto_spec(model, method, gib, gpus, host)
    p = plan(spec)
    _check_alternatives(spec, p)
    _check_advice(spec, p)
    if not p.fits:
        assert p.alternatives or "nothing_fits" in {n.code for n in p.warnings}


def _pinned_refusal(model: str, method: str, gib: int, host: int) -> dict[str, Any]:
    spec = auto_spec(model, method, gib, 1, host, accumulation=8)
    spec["training"].update(micro_batch_size=4, gradient_checkpointing=False)
    spec["resources"] = {"num_gpus": 1, "zero_stage": 2, "offload_optimizer": "none", "offload_param": "none"}
    return spec


@pytest.mark.parametrize(("model", "method", "gib", "host"), [
    ("Qwen/Qwen2.5-7B", "lora", 10, 64),  # the issue's refusals with nothing to offer
    ("Qwen/Qwen2.5-7B", "full", 10, 16),
    ("Qwen/Qwen2.5-7B", "lora", 24, 64),
    ("meta-llama/Llama-3.1-8B", "full", 80, 256),
    ("Qwen/Qwen2.5-1.5B", "full", 16, 64),
    ("google/gemma-2-9b", "qlora", 8, 32),
])
def test_refusals_offer_fixes_that_fit_or_say_nothing_does(model: str, method: str, gib: int,
                                                           host: int) -> None:
    auto = auto_spec(model, method, gib, 1, host, accumulation=8)
    for spec in (auto, _pinned_refusal(model, method, gib, host)):
        p = plan(spec)
        if p.fits:
            continue
        codes = {n.code for n in p.warnings}
        assert p.alternatives or "nothing_fits" in codes
        assert bool(p.alternatives) != ("nothing_fits" in codes)
        _check_alternatives(spec, p)
        _check_advice(spec, p)


def test_the_field_reports_7b_lora_fits_10_gib_and_a_smaller_card_is_told_what_fits() -> None:
    # the field report's own case: on one GPU ZeRO-3 offloads the parameters (measured through the
    # service at 8.33 GiB under a 10 GiB card limit, bench/results/field-cases/)
    p = plan(auto_spec("Qwen/Qwen2.5-7B", "lora", 10, 1, 64, accumulation=8))
    assert p.fits and p.resolved.zero_stage == 3 and p.resolved.offload_param == "cpu"
    smaller = plan(auto_spec("Qwen/Qwen2.5-7B", "lora", 7, 1, 64, accumulation=8))
    assert not smaller.fits and smaller.alternatives
    assert all(a.per_gpu_required_bytes <= 7 * GIB for a in smaller.alternatives)


def test_adapters_reduce_bucket_is_sized_to_their_parameters_unless_pinned() -> None:
    spec = auto_spec("Qwen/Qwen2.5-7B", "lora", 80)
    spec["resources"] = {"zero_stage": 3, "num_gpus": 1}  # ZeRO-3 holds its bucket throughout
    p = plan(spec)
    bucket = p.deepspeed_config["zero_optimization"]["reduce_bucket_size"]
    assert p.model.trainable_parameters <= bucket < 500_000_000
    spec["resources"]["deepspeed"] = {"reduce_bucket_size": 500_000_000}
    pinned = plan(spec)
    assert pinned.deepspeed_config["zero_optimization"]["reduce_bucket_size"] == 500_000_000
    assert pinned.per_gpu.required_bytes > p.per_gpu.required_bytes
    bucket_advice = [n for n in pinned.advice if n.field == "resources.deepspeed.reduce_bucket_size"]
    assert bucket_advice and bucket_advice[0].saves_bytes == pytest.approx(
        pinned.per_gpu.required_bytes - p.per_gpu.required_bytes, rel=0.01)


def test_more_gpus_than_the_box_has_is_its_own_refusal() -> None:
    spec = auto_spec("Qwen/Qwen2.5-7B", "lora", 80)
    spec["resources"] = {"num_gpus": 8}
    with pytest.raises(PlanError) as info:
        plan(spec)
    assert info.value.code == "num_gpus_exceeds_box" and info.value.field == "resources.num_gpus"
    assert "8 GPUs asked, the box has 1" in info.value.message


def test_qlora_where_the_box_cannot_run_it_is_its_own_refusal() -> None:
    spec = auto_spec("Qwen/Qwen2.5-7B", "qlora", 80)
    spec["hardware"]["qlora_unavailable"] = "bitsandbytes is not installed"
    with pytest.raises(PlanError) as info:
        plan(spec)
    assert info.value.code == "method_unavailable" and info.value.field == "method"
    lora = auto_spec("Qwen/Qwen2.5-7B", "lora", 10, 1, 64, accumulation=8)
    lora["hardware"]["qlora_unavailable"] = "bitsandbytes is not installed"
    assert all(a.changes.get("method") != "qlora" for a in plan(lora).alternatives)


@pytest.mark.parametrize("gpu_gib", [10, 24, 80])
def test_qlora_is_never_planned_under_zero3(gpu_gib: int) -> None:
    """The trainer loads QLoRA's 4-bit weights whole onto each GPU, which ZeRO-3 cannot partition:
    neither the choice nor an alternative may be ZeRO-3, and a spec that pins it is refused."""
    spec = auto_spec("Qwen/Qwen2.5-7B", "qlora", gpu_gib)
    p = plan(spec)
    assert p.resolved.zero_stage != 3
    for alternative in p.alternatives:
        if alternative.kind == "configuration":
            assert alternative.changes.get("resources.zero_stage") != 3
    pinned = copy.deepcopy(spec)
    pinned["resources"] = {"zero_stage": 3}
    with pytest.raises(PlanError, match="QLoRA runs under ZeRO stage 0, 1 or 2") as err:
        plan(pinned)
    assert err.value.field == "resources.zero_stage"
