"""The GPU catalogue (planner/data/gpus.json) and the hardware figures a plan runs on."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import pytest

from planner import PlanError, plan
from planner import constants as C
from planner.hardware import find_card, gpu_catalogue, reference_card, resolve_hardware
from planner.spec import HardwareSpec
from tests.planner.support import GIB, hardware, job

RAW = json.loads(resources.files("planner").joinpath("data/gpus.json").read_text(encoding="utf-8"))
CARDS: dict[str, dict[str, Any]] = RAW["cards"]


def _numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", text)]


@pytest.mark.parametrize("name", sorted(CARDS))
def test_each_cards_tensor_rate_is_its_quoted_dense_figure_or_half_the_sparse_one(name: str) -> None:
    entry = CARDS[name]
    assert entry["source"].startswith("https://")
    assert entry.get("memory_source", entry["source"]).startswith("https://")
    quoted = entry["tensor_quoted"]
    rate = entry["bf16_tflops"] or entry["fp16_tflops"]
    numbers = _numbers(quoted.split(";")[0].split(":")[-1])
    if "|" in quoted:  # "dense | sparse*"
        dense, sparse = numbers[-2], numbers[-1]
        assert rate == pytest.approx(dense) and sparse == pytest.approx(2 * dense, rel=0.02)
    elif "*" in quoted:  # only the rate with sparsity is quoted
        per_card = numbers[-1] * 1000 / 8 if "PFLOPS" in quoted and "8 GPUs" in quoted else numbers[-1]
        assert rate == pytest.approx(per_card / 2, rel=0.005)
    else:
        assert rate == pytest.approx(numbers[-1])
    if "no bfloat16" in quoted:
        assert entry["bf16_tflops"] is None


@pytest.mark.parametrize("name", sorted(CARDS))
def test_each_cards_memory_is_the_quoted_size(name: str) -> None:
    entry = CARDS[name]
    quoted = entry["memory_quoted"]
    size = _numbers(quoted.split(":")[-1])[0]
    if "8 GPUs" in quoted:
        size /= 8  # a box of eight cards
    assert entry["memory_gib"] == pytest.approx(size)
    assert str(entry["pcie_gen"]) in RAW["pcie_gbps_per_lane"] and entry["pcie_lanes"] in (8, 16)


def test_catalogue_spans_classes_and_generations() -> None:
    cards = gpu_catalogue().values()
    assert len(cards) >= 20
    assert {c.card_class for c in cards} == {"datacenter", "workstation", "consumer"}
    assert {"volta", "turing", "ampere", "ada", "hopper", "blackwell"} <= {c.architecture for c in cards}


@pytest.mark.parametrize(
    ("given", "card"),
    [
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
        ("nvidia geforce rtx 4090", "NVIDIA GeForce RTX 4090"),
        ("RTX 4090", "NVIDIA GeForce RTX 4090"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
        ("Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB"),
        ("NVIDIA H200", "NVIDIA H200"),
    ],
)
def test_cards_are_found_by_their_nvml_names(given: str, card: str) -> None:
    found = find_card(given)
    assert found is not None and found.name == card


@pytest.mark.parametrize("given", ["NVIDIA H200 NVL", "NVIDIA GeForce RTX 4090 D", "cpu", ""])
def test_a_card_the_catalogue_lacks_is_not_taken_for_a_neighbour(given: str) -> None:
    assert find_card(given) is None


def _what_if(gpu_name: str, **extra: Any) -> dict[str, Any]:
    hw = hardware()
    del hw["gpu_memory_bytes"]
    return job(hardware={**hw, "gpu_name": gpu_name, **extra})


def _seven_b_on(gpu_name: str) -> dict[str, Any]:
    """A 7B LoRA step that fits 24 GiB: mostly matmuls, so the card's rate sets its pace."""
    spec = _what_if(gpu_name)
    spec["model"] = {"name": "Qwen/Qwen2.5-7B"}
    spec["training"] = {
        "micro_batch_size": 1,
        "gradient_accumulation_steps": 4,
        "seq_len": 1024,
        "gradient_checkpointing": True,
    }
    spec["resources"] = {"num_gpus": 1, "zero_stage": 0, "offload_optimizer": "none", "offload_param": "none"}
    return spec


def test_a_catalogue_cards_rate_memory_and_link_flow_into_the_plan() -> None:
    rtx, h200 = plan(_seven_b_on("NVIDIA GeForce RTX 4090")), plan(_seven_b_on("NVIDIA H200"))
    card, ref = find_card("NVIDIA GeForce RTX 4090"), reference_card()
    assert card is not None
    hw = rtx.hardware
    assert hw is not None and hw.card == card.name and hw.card_source == card.source
    assert hw.gpu_memory_bytes.source == "catalogue" and hw.gpu_memory_bytes.value == 24 * GIB
    assert rtx.per_gpu.capacity_bytes == 24 * GIB
    assert hw.gpu_flops.source == "catalogue"
    assert hw.gpu_flops.value == pytest.approx(C.DEFAULT_GPU_FLOPS * card.bf16_tflops / ref.bf16_tflops)
    # Gen4 x16 against the reference's Gen5 x16
    assert hw.pcie_bytes_per_s.value == pytest.approx(C.PCIE_BYTES_PER_S / 2, rel=0.01)
    assert h200.hardware is not None and h200.hardware.gpu_flops.value == pytest.approx(C.DEFAULT_GPU_FLOPS)
    # the same job: the card with a sixth of the rate takes more than twice as long a step (the
    # host's share of the step is the same on both)
    assert rtx.fits and rtx.estimated_step_seconds > 2 * h200.estimated_step_seconds


def test_the_cards_memory_bandwidth_comes_from_the_catalogue_the_spec_or_the_reference_card() -> None:
    h100 = plan(_seven_b_on("NVIDIA H100 80GB HBM3")).hardware
    assert h100 is not None and h100.gpu_memory_bandwidth.source == "catalogue"
    assert h100.gpu_memory_bandwidth.value == 3350e9
    given = plan(_what_if("NVIDIA H100 80GB HBM3", gpu_memory_bandwidth_gbps=3000.0)).hardware
    assert given is not None and given.gpu_memory_bandwidth.source == "spec"
    assert given.gpu_memory_bandwidth.value == 3000e9
    default = plan(job()).hardware
    assert default is not None and default.gpu_memory_bandwidth.source == "default"
    assert default.gpu_memory_bandwidth.value == reference_card().memory_bandwidth_gbps * 1e9


def test_given_memory_wins_over_the_catalogue_and_says_so() -> None:
    result = plan(_what_if("NVIDIA GeForce RTX 4090", gpu_memory_bytes=20 * GIB))
    assert result.hardware is not None
    assert result.hardware.gpu_memory_bytes.source == "spec"
    assert result.per_gpu.capacity_bytes == 20 * GIB
    assert result.hardware.gpu_flops.source == "catalogue"


def test_an_unknown_card_without_memory_is_refused_naming_the_field() -> None:
    with pytest.raises(PlanError) as caught:
        plan(_what_if("NVIDIA GeForce RTX 4070"))
    assert caught.value.field == "hardware.gpu_name"
    assert "RTX 4080" in caught.value.message or "RTX 4090" in caught.value.message


def test_a_spec_without_memory_or_card_is_invalid() -> None:
    hw = hardware()
    del hw["gpu_memory_bytes"]
    with pytest.raises(PlanError) as caught:
        plan(job(hardware=hw))
    assert caught.value.field == "hardware"


def test_without_a_card_the_plan_says_it_used_the_calibration_cards_defaults() -> None:
    result = plan(job())
    assert result.hardware is not None and result.hardware.card is None
    assert result.hardware.gpu_flops.source == "default"
    assert result.hardware.gpu_flops.value == C.DEFAULT_GPU_FLOPS
    assert result.hardware.gpu_memory_bytes.source == "spec"


def test_fp16_on_a_card_without_bf16_and_the_bf16_warning() -> None:
    spec = _what_if("Tesla V100-SXM2-32GB")
    bf16 = plan(spec)
    assert any(w.code == "no_bf16" for w in bf16.warnings)
    spec["training"] = {**spec["training"], "precision": "fp16"}
    fp16 = plan(spec)
    assert not any(w.code == "no_bf16" for w in fp16.warnings)
    card = find_card("Tesla V100-SXM2-32GB")
    assert card is not None and fp16.hardware is not None
    assert fp16.hardware.gpu_flops.value == pytest.approx(
        C.DEFAULT_GPU_FLOPS * card.fp16_tflops / reference_card().fp16_tflops
    )


def test_sources_the_service_fills_are_repeated_per_figure() -> None:
    hw = HardwareSpec.model_validate(
        {
            **hardware(),
            "gpu_name": "NVIDIA L40S",
            "pcie_gbps": 20.0,
            "step_time_factor": 1.3,
            "sources": {"pcie_gbps": "probe", "gpu_memory_bytes": "setting", "step_time_factor": "learned"},
        }
    )
    r = resolve_hardware(hw)
    assert (r.pcie_bytes_per_s.source, r.pcie_bytes_per_s.value) == ("probe", 20e9)
    assert r.gpu_memory_bytes.source == "setting"
    assert (r.step_time_factor.source, r.step_time_factor.value) == ("learned", 1.3)
    assert r.gpu_flops.source == "catalogue" and r.host_memory_bytes.source == "spec"
