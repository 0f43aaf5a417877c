"""The benchmark matrix: valid job specs, names that say what they run, a core group that fits."""

from __future__ import annotations

import re
from dataclasses import replace

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

NAME = re.compile(r"^(?P<model>[a-z0-9.\-]+)\|(?P<method>full|lora|qlora)\|z(?P<stage>[0-3])\|"
                  r"off=(?P<off>none|opt|opt\+param)\|(?P<ckpt>ckpt|nockpt)\|s(?P<seq>\d+)\|"
                  r"mb(?P<mb>\d+)\|g(?P<ga>\d+)(\|gpus(?P<gpus>\d+))?"
                  r"(\|t=(?P<targets>[a-z_.]+))?(\|r=(?P<rank>\d+))?(\|o=(?P<optimizer>[a-z0-9_]+))?$")

EVERY_CASE = [c for cases in MATRICES.values() for c in cases]


def _name_mismatches(case: Case) -> list[str]:
    """What the case's name says that its spec does not run (the name keys its measurement record)."""
    m = NAME.match(case.name)
    if m is None:
        return ["the name does not parse"]
    tr, res, lora = case.spec["training"], case.spec["resources"], case.spec["lora"]
    off = {"none": ("none", "none"), "opt": ("cpu", "none"), "opt+param": ("cpu", "cpu")}[m["off"]]
    targets = [f"{n}_proj" for n in m["targets"].split(".")] if m["targets"] else [
        "q_proj", "k_proj", "v_proj", "o_proj"]
    said = {"model": MODELS[m["model"]], "method": m["method"], "stage": int(m["stage"]), "offload": off,
            "ckpt": m["ckpt"] == "ckpt", "shape": (int(m["seq"]), int(m["mb"]), int(m["ga"])),
            "gpus": int(m["gpus"] or 1), "targets": targets, "rank": int(m["rank"] or 16),
            "optimizer": m["optimizer"] or "adamw"}
    runs = {"model": case.spec["model"]["config"], "method": case.spec["method"], "stage": res["zero_stage"],
            "offload": (res["offload_optimizer"], res["offload_param"]), "ckpt": tr["gradient_checkpointing"],
            "shape": (tr["seq_len"], tr["micro_batch_size"], tr["gradient_accumulation_steps"]),
            "gpus": res["num_gpus"], "targets": lora["target_modules"], "rank": lora["r"],
            "optimizer": tr["optimizer"]}
    return [key for key in said if said[key] != runs[key]]


def test_every_case_is_a_valid_job_spec_named_for_what_it_runs() -> None:
    """Every case of every matrix: the job spec the service accepts, and a name (the key of its
    record: resume, held-out or measured again) that says exactly what it runs."""
    wrong = {}
    for case in EVERY_CASE:
        spec = JobSpec.model_validate(case.spec)
        assert spec.model.config is not None and case.est_seconds > 0, case.name
        if problems := _name_mismatches(case):
            wrong[case.name] = problems
    assert wrong == {}


def test_a_name_that_misstates_its_case_is_caught() -> None:
    case = make_case("qwen2.5-0.5b", "full", 3, "opt", True, 1024, 2, 1)
    assert _name_mismatches(case) == []
    lying = replace(case, name=case.name.replace("|z3|", "|z2|").replace("|s1024|", "|s2048|"))
    assert _name_mismatches(lying) == ["stage", "shape"]


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
