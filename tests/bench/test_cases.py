"""The benchmark matrix: valid job specs, names that say what they run, a core group that fits."""

from __future__ import annotations

import re

import pytest

import planner
from bench.cases import (
    CASES,
    HELDOUT3_CASES,
    HELDOUT4_CASES,
    HELDOUT5_CASES,
    HELDOUT6_CASES,
    HELDOUT7_CASES,
    HELDOUT8_CASES,
    HELDOUT9_CASES,
    HELDOUT10_CASES,
    HELDOUT11_CASES,
    HELDOUT12_CASES,
    HELDOUT13_CASES,
    HELDOUT14_CASES,
    HELDOUT15_CASES,
    HELDOUT16_CASES,
    HELDOUT17_CASES,
    HELDOUT18_CASES,
    HELDOUT19_CASES,
    HELDOUT20_CASES,
    HELDOUT21_CASES,
    HELDOUT22_CASES,
    HELDOUT23_CASES,
    HELDOUT24_CASES,
    HELDOUT25_CASES,
    HELDOUT26_CASES,
    HELDOUT27_CASES,
    HELDOUT28_CASES,
    HELDOUT29_CASES,
    HELDOUT_CASES,
    LOGITS_CASES,
    MATRICES,
    MODELS,
    REPEAT_CASES,
    STEADY_CASES,
    Case,
    make_case,
    param_count,
)
from planner.spec import JobSpec

NAME = re.compile(r"^(?P<model>[a-z0-9.\-]+)\|(?P<method>full|lora)\|z(?P<stage>[0-3])\|"
                  r"off=(?P<off>none|opt|opt\+param)\|(?P<ckpt>ckpt|nockpt)\|s(?P<seq>\d+)\|"
                  r"mb(?P<mb>\d+)\|g(?P<ga>\d+)(\|gpus(?P<gpus>\d+))?"
                  r"(\|t=(?P<targets>[a-z_.]+))?(\|r=(?P<rank>\d+))?$")

ALL_CASES = (CASES + HELDOUT_CASES + HELDOUT3_CASES + HELDOUT4_CASES + HELDOUT25_CASES + HELDOUT27_CASES
             + HELDOUT28_CASES + HELDOUT29_CASES)


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_case_is_a_valid_job_spec(case: Case) -> None:
    spec = JobSpec.model_validate(case.spec)
    assert spec.model.config is not None
    assert spec.resources.zero_stage in (0, 1, 2, 3)
    assert case.est_seconds > 0


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_name_says_what_the_case_runs(case: Case) -> None:
    m = NAME.match(case.name)
    assert m, case.name
    tr, res = case.spec["training"], case.spec["resources"]
    assert case.spec["model"]["config"] == MODELS[m["model"]]
    assert case.spec["method"] == m["method"]
    assert res["zero_stage"] == int(m["stage"])
    off = {"none": ("none", "none"), "opt": ("cpu", "none"), "opt+param": ("cpu", "cpu")}[m["off"]]
    assert (res["offload_optimizer"], res["offload_param"]) == off
    assert tr["gradient_checkpointing"] is (m["ckpt"] == "ckpt")
    assert (tr["seq_len"], tr["micro_batch_size"], tr["gradient_accumulation_steps"]) == (
        int(m["seq"]), int(m["mb"]), int(m["ga"]))
    assert res["num_gpus"] == int(m["gpus"] or 1)
    targets = case.spec["lora"]["target_modules"]
    if m["targets"]:
        assert [f"{n}_proj" for n in m["targets"].split(".")] == targets
    else:
        assert targets == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert case.spec["lora"]["r"] == int(m["rank"] or 16)


def test_matrix_spans_the_space() -> None:
    assert 25 <= len(CASES) <= 40
    assert len({c.name for c in CASES}) == len(CASES)
    spans = {
        "model": {c.name.split("|")[0] for c in CASES},
        "method": {c.spec["method"] for c in CASES},
        "stage": {c.spec["resources"]["zero_stage"] for c in CASES},
        "offload": {(c.spec["resources"]["offload_optimizer"], c.spec["resources"]["offload_param"])
                    for c in CASES},
        "ckpt": {c.spec["training"]["gradient_checkpointing"] for c in CASES},
        "gpus": {c.num_gpus for c in CASES},
    }
    heldout_only = {"llama-3.2-3b", "mistral-7b-v0.3", "phi-3-mini", "gemma-2-2b", "llama-3.1-8b",
                    "gemma-2-9b", "gemma-7b", "qwen2.5-14b", "llama-3-8b", "mistral-7b-v0.1",
                    "gemma-2-2b-nosoftcap", "qwen3-4b"}
    assert spans["model"] == set(MODELS) - heldout_only
    assert spans["method"] == {"full", "lora"}
    assert spans["stage"] == {0, 2, 3}
    assert spans["offload"] == {("none", "none"), ("cpu", "none"), ("cpu", "cpu")}
    assert spans["ckpt"] == {True, False}
    assert spans["gpus"] == {1, 2}
    seqs = {c.spec["training"]["seq_len"] for c in CASES}
    assert min(seqs) == 512 and max(seqs) == 4096


def test_core_group_comes_first_and_fits_eight_minutes_on_one_gpu() -> None:
    groups = [c.group for c in CASES]
    n_core = groups.count("core")
    assert 12 <= n_core <= 16
    assert groups[:n_core] == ["core"] * n_core
    core = CASES[:n_core]
    assert all(c.num_gpus == 1 and c.expect == "ok" for c in core)
    assert sum(c.est_seconds for c in core) <= 480


def test_what_cannot_fit_is_left_out() -> None:
    for c in CASES:
        res = c.spec["resources"]
        full_7b = c.name.startswith("qwen2.5-7b|full")
        # 7B full fine-tuning with optimizer and parameters on the host needs more than its RAM.
        assert not (full_7b and res["offload_param"] == "cpu"), c.name
        if full_7b and c.num_gpus == 1:
            assert c.expect == "oom", c.name
    assert [c.name for c in CASES if c.expect == "oom"] == ["qwen2.5-7b|full|z0|off=none|nockpt|s4096|mb4|g1"]


def test_real_architectures_have_their_published_sizes() -> None:
    # Parameter counts as published on each model card.
    expected = {"qwen2.5-0.5b": 0.49e9, "qwen2.5-1.5b": 1.54e9, "qwen2.5-3b": 3.09e9,
                "qwen2.5-7b": 7.61e9, "llama-3.2-1b": 1.24e9}
    for name, n in expected.items():
        assert param_count(MODELS[name]) == pytest.approx(n, rel=0.01), name
    assert MODELS["qwen2.5-7b"]["vocab_size"] == 152064 and not MODELS["qwen2.5-7b"]["tie_word_embeddings"]
    assert MODELS["qwen2.5-0.5b"]["vocab_size"] == 151936 and MODELS["qwen2.5-0.5b"]["tie_word_embeddings"]


def test_estimates_grow_with_the_work() -> None:
    small = make_case("qwen2.5-0.5b", "full", 3, "none", True, 1024, 2, 1)
    longer = make_case("qwen2.5-0.5b", "full", 3, "none", True, 1024, 2, 8)
    offload = make_case("qwen2.5-0.5b", "full", 3, "opt", True, 1024, 2, 1)
    bigger = make_case("qwen2.5-7b", "full", 3, "none", True, 1024, 2, 1, gpus=2)
    assert small.est_seconds < longer.est_seconds
    assert small.est_seconds < offload.est_seconds
    assert small.est_seconds < bigger.est_seconds


def test_parameter_offload_without_zero3_is_refused() -> None:
    with pytest.raises(ValueError, match="ZeRO-3"):
        make_case("qwen2.5-0.5b", "full", 2, "opt+param", True, 1024, 2, 1)


def test_heldout_matrix_tests_what_the_calibration_never_saw() -> None:
    assert {k: v for k, v in MATRICES.items() if k not in ("limit", "logits")} == {
        "main": CASES, "heldout": HELDOUT_CASES, "heldout3": HELDOUT3_CASES, "heldout4": HELDOUT4_CASES,
        "heldout5": HELDOUT5_CASES, "heldout6": HELDOUT6_CASES, "heldout7": HELDOUT7_CASES,
        "heldout8": HELDOUT8_CASES, "heldout9": HELDOUT9_CASES, "heldout10": HELDOUT10_CASES,
        "heldout11": HELDOUT11_CASES, "heldout12": HELDOUT12_CASES, "heldout13": HELDOUT13_CASES,
        "heldout14": HELDOUT14_CASES, "heldout15": HELDOUT15_CASES, "heldout16": HELDOUT16_CASES,
        "heldout17": HELDOUT17_CASES, "heldout18": HELDOUT18_CASES, "heldout19": HELDOUT19_CASES,
        "heldout20": HELDOUT20_CASES, "heldout21": HELDOUT21_CASES, "heldout22": HELDOUT22_CASES,
        "heldout23": HELDOUT23_CASES, "heldout24": HELDOUT24_CASES, "heldout25": HELDOUT25_CASES,
        "heldout26": HELDOUT26_CASES, "heldout27": HELDOUT27_CASES,
        "heldout28": HELDOUT28_CASES, "heldout29": HELDOUT29_CASES, "repeat": REPEAT_CASES,
        "steady": STEADY_CASES}
    calibrated = {c.name for c in CASES}
    assert not calibrated & {c.name for c in HELDOUT_CASES}
    families = {c.spec["model"]["config"]["model_type"] for c in HELDOUT_CASES}
    assert {"mistral", "phi3", "gemma2"} <= families
    assert 1 in {c.spec["resources"]["zero_stage"] for c in HELDOUT_CASES}
    assert max(c.spec["training"]["seq_len"] for c in HELDOUT_CASES) == 8192
    for c in HELDOUT_CASES:  # each one is planned to fit the GPU it will run on
        assert planner.plan(c.spec).fits, c.name


def test_later_heldout_matrices_repeat_no_measured_configuration() -> None:
    seen = {c.name for c in CASES} | {c.name for c in HELDOUT_CASES}
    for later in (HELDOUT3_CASES, HELDOUT4_CASES, HELDOUT5_CASES, HELDOUT6_CASES, HELDOUT7_CASES,
                  HELDOUT8_CASES, HELDOUT9_CASES, HELDOUT10_CASES, HELDOUT11_CASES,
                  HELDOUT12_CASES, HELDOUT13_CASES, HELDOUT14_CASES, HELDOUT15_CASES, HELDOUT16_CASES,
                  HELDOUT17_CASES, HELDOUT18_CASES, HELDOUT19_CASES, HELDOUT20_CASES, HELDOUT21_CASES,
                  HELDOUT22_CASES, HELDOUT23_CASES, HELDOUT24_CASES, HELDOUT25_CASES,
                  HELDOUT26_CASES, HELDOUT27_CASES, HELDOUT28_CASES,
                  HELDOUT29_CASES):
        names = [c.name for c in later]
        assert len(set(names)) == len(names) and not seen & set(names)
        seen |= set(names)
        if later is HELDOUT16_CASES:  # the logits matrix came next and repeats one of its cases
            seen |= {c.name for c in LOGITS_CASES}
        for c in later:
            assert planner.plan(c.spec).fits, c.name
    two_gpu = [c for c in HELDOUT3_CASES if c.num_gpus == 2]
    # the shapes the second held-out set missed: accumulation and parameter offload on two GPUs
    assert any(c.spec["training"]["gradient_accumulation_steps"] > 1 for c in two_gpu)
    assert any(c.spec["resources"]["offload_param"] == "cpu" for c in two_gpu)


def test_the_tenth_heldout_matrix_brings_models_no_earlier_matrix_ran() -> None:
    def models(cases: list[Case]) -> set[str]:
        return {c.name.split("|")[0] for c in cases}

    earlier = set().union(*(models(cases) for name, cases in MATRICES.items()
                            if name not in ("heldout10", "heldout11", "heldout12", "heldout13",
                                            "heldout14", "heldout15", "heldout16", "repeat",
                                            "steady", "logits", "heldout17", "heldout18",
                                            "heldout19", "heldout20", "heldout21",
                                            "heldout22", "heldout23", "heldout24",
                                            "heldout25", "heldout26", "heldout27",
                                            "heldout28", "heldout29")))
    new = models(HELDOUT10_CASES) - earlier
    assert new == {"gemma-2-9b", "gemma-7b", "qwen2.5-14b", "llama-3-8b", "mistral-7b-v0.1"}
    assert new <= set(MODELS)


def test_the_limit_experiment_reruns_measured_configurations() -> None:
    # its runs are compared with the same configurations' unlimited records
    measured = {c.name for m in ("main", "heldout", "heldout3", "heldout4") for c in MATRICES[m]}
    names = [c.name for c in MATRICES["limit"]]
    assert names and len(set(names)) == len(names) and set(names) <= measured


def test_the_repeat_matrix_runs_measured_configurations_again() -> None:
    """The repeats are configurations earlier matrices measured, each planned to fit."""
    measured = {c.name for name, cases in MATRICES.items()
                if name not in ("repeat", "steady", "limit") for c in cases}
    names = [c.name for c in REPEAT_CASES]
    assert len(set(names)) == len(names) == 5 and set(names) <= measured
    for c in REPEAT_CASES:
        assert planner.plan(c.spec).fits, c.name


def test_the_steady_matrix_measures_earlier_configurations_over_ten_steps() -> None:
    """Each steady case is a configuration an earlier matrix measured over two or three steps,
    now measured over ten, and planned to fit; both GPU counts and both methods are there."""
    earlier = {c.name: c for name, cases in MATRICES.items()
               if name not in ("repeat", "steady", "limit", "heldout16") for c in cases}
    names = [c.name for c in STEADY_CASES]
    assert len(set(names)) == len(names) and set(names) <= set(earlier)
    for c in STEADY_CASES:
        assert c.measured_steps == 10 and earlier[c.name].measured_steps <= 3, c.name
        assert planner.plan(c.spec).fits, c.name
    assert {c.num_gpus for c in STEADY_CASES} == {1, 2}
    assert {c.spec["method"] for c in STEADY_CASES} == {"full", "lora"}
    assert all(c.measured_steps == 10 for c in HELDOUT16_CASES + HELDOUT19_CASES + HELDOUT20_CASES)


def test_the_logits_matrix_isolates_the_soft_capping_of_gemma_2() -> None:
    """LoRA cases without checkpointing (one with it, as control), planned to fit; the Gemma 2 2B
    variant without soft-capping differs from the catalogued model in that field alone."""
    names = [c.name for c in LOGITS_CASES]
    assert len(set(names)) == len(names)
    assert all(c.spec["method"] == "lora" for c in LOGITS_CASES)
    assert sum(c.spec["training"]["gradient_checkpointing"] for c in LOGITS_CASES) == 1
    capped, plain = MODELS["gemma-2-2b"], MODELS["gemma-2-2b-nosoftcap"]
    assert capped["final_logit_softcapping"] == 30.0 and plain["final_logit_softcapping"] is None
    assert {k: v for k, v in plain.items() if k != "final_logit_softcapping"} == {
        k: v for k, v in capped.items() if k != "final_logit_softcapping"}
    for c in LOGITS_CASES:
        assert planner.plan(c.spec).fits, c.name
    # soft-capping keeps one more vocabulary-sized bf16 tensor through the loss
    with_cap = planner.plan(LOGITS_CASES[0].spec).per_gpu.logits_bytes
    without = planner.plan(LOGITS_CASES[1].spec).per_gpu.logits_bytes
    assert with_cap - without == 2 * 256000 * 4 * 1024
