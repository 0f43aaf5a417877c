"""The GPU catalogue (``planner/data/gpus.json``) and the hardware figures a plan runs on.

A plan's GPU rate, PCIe rate and card memory come from, in this order: the spec (``hardware``
fields a user gives, or the service fills from its box probe and settings), the catalogue entry of
``hardware.gpu_name``, and the planner's defaults, which describe the card its step-time constants
were fitted on (the catalogue's reference card). Catalogue and probe figures enter the plan as
ratios to that reference card, since the fitted MFU and offload rates are relative to it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Literal

from planner import constants as C
from planner.constants import GIB
from planner.errors import PlanError
from planner.models import HardwareFigure, PlannedHardware
from planner.spec import FigureSource, HardwareSpec

__all__ = [
    "GpuCard",
    "ResolvedHardware",
    "Source",
    "find_card",
    "planned_hardware",
    "gpu_catalogue",
    "pcie_bytes_per_s_from_probe",
    "reference_card",
    "resolve_hardware",
    "tflops_from_probe",
]

#: Where a hardware figure of a plan came from: what a spec may name, or the planner's default.
Source = Literal[FigureSource, "default"]



@dataclass(frozen=True, slots=True)
class GpuCard:
    """One catalogue entry: a card as its datasheet describes it."""

    name: str  # as NVML spells it
    architecture: str
    card_class: str  # datacenter | workstation | consumer
    bf16_tflops: float | None  # dense, FP32 accumulation; None where the card has no bf16 tensor cores
    fp16_tflops: float
    tensor_quoted: str
    memory_gib: float
    memory_quoted: str
    memory_bandwidth_gbps: float
    pcie_gen: int
    pcie_lanes: int
    nvlink_gbps: float | None
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def pcie_link_gbps(self) -> float:
        """The link's rate per direction (GB/s) from its generation and lanes."""
        return _catalogue_raw_pcie()[str(self.pcie_gen)] * self.pcie_lanes

    def tensor_tflops(self, precision: str) -> float:
        """The dense tensor rate a job at ``precision`` runs at (fp16's where there is no bf16)."""
        if precision == "fp16" or self.bf16_tflops is None:
            return self.fp16_tflops
        return self.bf16_tflops


def _raw() -> dict[str, Any]:
    text = resources.files("planner").joinpath("data/gpus.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


@cache
def _catalogue_raw_pcie() -> dict[str, float]:
    return {k: float(v) for k, v in _raw()["pcie_gbps_per_lane"].items()}


@cache
def gpu_catalogue() -> dict[str, GpuCard]:
    cards: dict[str, GpuCard] = {}
    for name, e in _raw()["cards"].items():
        cards[name] = GpuCard(
            name=name,
            architecture=e["architecture"],
            card_class=e["class"],
            bf16_tflops=None if e["bf16_tflops"] is None else float(e["bf16_tflops"]),
            fp16_tflops=float(e["fp16_tflops"]),
            tensor_quoted=e["tensor_quoted"],
            memory_gib=float(e["memory_gib"]),
            memory_quoted=e["memory_quoted"],
            memory_bandwidth_gbps=float(e["memory_bandwidth_gbps"]),
            pcie_gen=int(e["pcie_gen"]),
            pcie_lanes=int(e["pcie_lanes"]),
            nvlink_gbps=None if e["nvlink_gbps"] is None else float(e["nvlink_gbps"]),
            source=e["source"],
        )
    return cards


@cache
def _reference() -> dict[str, Any]:
    ref: dict[str, Any] = _raw()["reference"]
    return ref


def reference_card() -> GpuCard:
    """The card the step-time constants describe (``DEFAULT_GPU_FLOPS``, ``PCIE_BYTES_PER_S``)."""
    return gpu_catalogue()[_reference()["card"]]


_NOISE = re.compile(r"\b(nvidia|tesla|geforce)\b|[\s_\-]+")


def _key(name: str) -> str:
    return _NOISE.sub("", name.lower())


@cache
def _by_key() -> dict[str, GpuCard]:
    return {_key(name): card for name, card in gpu_catalogue().items()}


@lru_cache(maxsize=256)
def find_card(name: str | None) -> GpuCard | None:
    """The catalogue entry of a card named as NVML names it; case, spaces, hyphens and the words
    NVIDIA, Tesla and GeForce do not matter. None where the catalogue has no such card."""
    if not name:
        return None
    return _by_key().get(_key(name))


def _close_names(name: str) -> list[str]:
    """Cards of the same series (the first two digits of the model number: RTX 40.., A1..)."""
    wanted = re.findall(r"[a-z]+|\d+", _key(name))
    if not wanted:
        return []
    letters = next((w for w in wanted if w.isalpha()), "")
    digits = next((w for w in wanted if w.isdigit()), "")
    close = []
    for card in gpu_catalogue():
        key = _key(card)
        if letters in key and (not digits or digits[:2] in key):
            close.append(card)
    return sorted(close)[:4]


def tflops_from_probe(probe_tflops: float) -> float | None:
    """The planner's rate (TFLOPS on the scale ``DEFAULT_GPU_FLOPS`` sets) for a card whose probe
    timed ``probe_tflops`` of bf16 matmuls; None until the reference card's probe is recorded."""
    ref = _reference().get("probe_matmul_tflops")
    if not ref or probe_tflops <= 0:
        return None
    return C.DEFAULT_GPU_FLOPS / 1e12 * probe_tflops / float(ref)


def pcie_bytes_per_s_from_probe(h2d_pinned_gbps: float) -> float | None:
    """The planner's offload rate for a box whose probe copied pinned memory at ``h2d_pinned_gbps``."""
    ref = _reference().get("probe_h2d_pinned_gbps")
    if not ref or h2d_pinned_gbps <= 0:
        return None
    return C.PCIE_BYTES_PER_S * h2d_pinned_gbps / float(ref)


@dataclass(frozen=True, slots=True)
class Figure:
    value: float
    source: Source
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class ResolvedHardware:
    """``hardware`` with every figure the plan uses filled, and where each came from."""

    spec: HardwareSpec  # gpu_memory_bytes filled
    card: GpuCard | None
    gpu_memory_bytes: Figure
    gpu_flops: Figure
    pcie_bytes_per_s: Figure
    gpu_memory_bandwidth: Figure
    host_memory_bytes: Figure
    nvme_bytes: Figure
    step_time_factor: Figure
    host_clock_factor: Figure
    gpu_memory_correction: Figure


def _given(hw: HardwareSpec, field: str, fallback: Source = "spec") -> Source:
    source = hw.sources.get(field)
    return source if source is not None else fallback


def _memory(hw: HardwareSpec, card: GpuCard | None) -> Figure:
    if hw.gpu_memory_bytes is not None:
        return Figure(hw.gpu_memory_bytes, _given(hw, "gpu_memory_bytes"))
    if card is None:
        assert hw.gpu_name is not None  # the spec's validator asks for one of the two
        close = _close_names(hw.gpu_name)
        hint = f"; the catalogue has {', '.join(close)}" if close else ""
        raise PlanError(
            "hardware.gpu_name",
            f"{hw.gpu_name!r} is not in the GPU catalogue{hint}: give hardware.gpu_memory_bytes",
            code="unknown_gpu",
        )
    return Figure(card.memory_bytes, "catalogue", f"{card.memory_quoted} ({card.source})")


def _flops(hw: HardwareSpec, card: GpuCard | None, precision: str) -> Figure:
    if hw.gpu_bf16_tflops is not None:
        return Figure(hw.gpu_bf16_tflops * 1e12, _given(hw, "gpu_bf16_tflops"))
    ref = reference_card()
    if card is None:
        return Figure(C.DEFAULT_GPU_FLOPS, "default", f"the planner's calibration card, {ref.name}")
    rate = C.DEFAULT_GPU_FLOPS * card.tensor_tflops(precision) / ref.tensor_tflops(precision)
    detail = f"{card.tensor_quoted} ({card.source}), relative to {ref.name}'s {ref.tensor_quoted}"
    return Figure(rate, "catalogue", detail)


def _pcie(hw: HardwareSpec, card: GpuCard | None) -> Figure:
    if hw.pcie_gbps is not None:
        return Figure(hw.pcie_gbps * 1e9, _given(hw, "pcie_gbps"))
    ref = reference_card()
    if card is None:
        return Figure(C.PCIE_BYTES_PER_S, "default", f"the planner's calibration card, {ref.name}")
    rate = C.PCIE_BYTES_PER_S * card.pcie_link_gbps / ref.pcie_link_gbps
    detail = (
        f"PCIe Gen{card.pcie_gen} x{card.pcie_lanes} against {ref.name}'s Gen{ref.pcie_gen} x{ref.pcie_lanes}"
    )
    return Figure(rate, "catalogue", detail)


def _bandwidth(hw: HardwareSpec, card: GpuCard | None) -> Figure:
    """The card's memory bandwidth: the memory-bound kernels' bytes move at it."""
    if hw.gpu_memory_bandwidth_gbps is not None:
        return Figure(hw.gpu_memory_bandwidth_gbps * 1e9, _given(hw, "gpu_memory_bandwidth_gbps"))
    if card is None:
        ref = reference_card()
        detail = f"the planner's calibration card, {ref.name}"
        return Figure(ref.memory_bandwidth_gbps * 1e9, "default", detail)
    return Figure(card.memory_bandwidth_gbps * 1e9, "catalogue", card.source)


def _factor(hw: HardwareSpec, field: str) -> Figure:
    value = getattr(hw, field)
    if value is None:
        return Figure(1.0, "default")
    return Figure(float(value), _given(hw, field))


def resolve_hardware(hw: HardwareSpec, precision: str = "bf16") -> ResolvedHardware:
    """Every figure of ``hw`` the plan needs, from the spec, the catalogue or the defaults."""
    card = find_card(hw.gpu_name)
    memory = _memory(hw, card)
    filled = (
        hw
        if hw.gpu_memory_bytes is not None
        else hw.model_copy(update={"gpu_memory_bytes": int(memory.value)})
    )
    return ResolvedHardware(
        spec=filled,
        card=card,
        gpu_memory_bytes=memory,
        gpu_flops=_flops(hw, card, precision),
        pcie_bytes_per_s=_pcie(hw, card),
        gpu_memory_bandwidth=_bandwidth(hw, card),
        host_memory_bytes=Figure(hw.host_memory_bytes, _given(hw, "host_memory_bytes")),
        nvme_bytes=Figure(hw.nvme_bytes, _given(hw, "nvme_bytes")),
        step_time_factor=_factor(hw, "step_time_factor"),
        host_clock_factor=_factor(hw, "host_clock_factor"),
        gpu_memory_correction=_factor(hw, "gpu_memory_correction"),
    )


def _out(figure: Figure, unit: str) -> HardwareFigure:
    return HardwareFigure(value=figure.value, unit=unit, source=figure.source, detail=figure.detail)


def planned_hardware(r: ResolvedHardware) -> PlannedHardware:
    """The plan's ``hardware`` section."""
    return PlannedHardware(
        gpu_name=r.spec.gpu_name,
        card=r.card.name if r.card else None,
        card_source=r.card.source if r.card else None,
        gpu_count=r.spec.gpu_count,
        gpu_memory_bytes=_out(r.gpu_memory_bytes, "bytes"),
        gpu_flops=_out(r.gpu_flops, "FLOP/s"),
        pcie_bytes_per_s=_out(r.pcie_bytes_per_s, "bytes/s"),
        gpu_memory_bandwidth=_out(r.gpu_memory_bandwidth, "bytes/s"),
        host_memory_bytes=_out(r.host_memory_bytes, "bytes"),
        nvme_bytes=_out(r.nvme_bytes, "bytes"),
        step_time_factor=_out(r.step_time_factor, "ratio"),
        host_clock_factor=_out(r.host_clock_factor, "ratio"),
        gpu_memory_correction=_out(r.gpu_memory_correction, "ratio"),
    )
