"""The planner against real measurements: every record of ``bench/results/*.jsonl`` re-planned.

For each measured case (``bench/measure.py``), the planner plans the same spec and the report puts
the two side by side: the busiest GPU's NVML peak against ``per_gpu.total_bytes``, torch's
allocated and reserved peaks against the planned allocated peak (so the constants for the CUDA
context and the allocator's slack can be read off), host RSS against ``host.total_bytes`` for
offload cases, and step time against ``estimated_step_seconds``. Errors are
(planned - measured) / measured: negative means the planner under-estimated.

Usage: ``.venv/bin/python bench/accuracy.py [RESULTS.jsonl ...] [--out docs/accuracy.md]``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

if __package__ in (None, ""):  # run as a script: make ``planner`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.accuracy_service import (  # noqa: E402
    Observation,
    anchors_section,
    breakdown_section,
    observation,
    report_files,
    service_hardware,
    service_observations,
    service_section,
)
from bench.accuracy_service import stats as _stats  # noqa: E402
from planner import Plan, PlanError, plan  # noqa: E402
from planner import constants as C  # noqa: E402
from planner.calibration import trial  # noqa: E402
from planner.core import attention_for, prepare  # noqa: E402
from planner.memory import host_staging_peak  # noqa: E402
from planner.setup import Setup  # noqa: E402
from planner.speed import (  # noqa: E402
    SpeedConstants,
    StepTerms,
    host_clock_factor,
    step_phases,
    step_seconds,
    step_terms,
)

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024**3


@dataclass(frozen=True)
class Row:
    case: str
    status: str
    record: dict[str, Any]
    plan: Plan | None
    problem: str | None
    source: str = ""

    @property
    def calibration(self) -> bool:
        """Whether the planner's constants were fitted on this record (C.CALIBRATION_RESULTS)."""
        return self.source in C.CALIBRATION_RESULTS

    def measured(self, key: str) -> float | None:
        value = (self.record.get("measured") or {}).get(key)
        return float(value) if isinstance(value, int | float) else None

    def measured_list(self, key: str) -> list[float]:
        values = (self.record.get("measured") or {}).get(key)
        return [float(v) for v in values] if isinstance(values, list) else []

    @property
    def offloaded(self) -> bool:
        res = self.record["spec"].get("resources", {})
        return "cpu" in (res.get("offload_optimizer"), res.get("offload_param")) or "nvme" in (
            res.get("offload_optimizer"),
            res.get("offload_param"),
        )


def load_records(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Records of every file, each tagged with its file's name under ``_source``; where the case or
    its run probed the host (``host_probe_us``), the spec's hardware carries the host-clock factor
    the service would give its box (``planner.host_clock_factor``)."""
    records = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = {**json.loads(line), "_source": path.name}
                records.append(_with_host_clock(as_run(rec)))
    return records


def as_run(rec: dict[str, Any]) -> dict[str, Any]:
    """The record's spec as its harness ran it: the attention it used, on its rows."""
    return with_full_rows(with_attention(rec))


def with_attention(rec: dict[str, Any]) -> dict[str, Any]:
    """The record's spec naming the attention its run used (``measured.attn_implementation``);
    records without that figure come from a harness that asked for SDPA, which transformers 5.17
    gave every model, Gemma 2 included."""
    spec = rec.get("spec")
    if not isinstance(spec, dict) or (spec.get("training") or {}).get("attn_implementation"):
        return rec
    used = (rec.get("measured") or {}).get("attn_implementation") or "sdpa"
    return {**rec, "spec": {**spec, "training": {**spec.get("training", {}), "attn_implementation": used}}}


def with_full_rows(rec: dict[str, Any]) -> dict[str, Any]:
    """The record's spec with the rows its harness trained on: every row ``seq_len`` random tokens,
    one sequence, so no attention mask (the service's packed rows carry one)."""
    spec = rec.get("spec")
    if not isinstance(spec, dict) or spec.get("dataset") is not None:
        return rec
    seq_len = (spec.get("training") or {}).get("seq_len")
    if not isinstance(seq_len, int):
        return rec
    rows = {"path": "random-token-rows", "format": "text", "eval_fraction": 0.0, "num_rows": 1,
            "num_tokens": seq_len}
    return {**rec, "spec": {**spec, "dataset": rows}}


def host_probe_us(rec: dict[str, Any]) -> float | None:
    """The hooked-module time of the host as the record's case found it: the slowest of the probes
    its ranks read in their own processes before importing DeepSpeed (``measured.case_host_probes``;
    the ranks wait for each other, so the slowest sets the step), else the run's probe
    (``env.host_probe``, a child before the cases). The same box read 15.5-30.9 us from case to case
    within one run, so the case's own reading is the closer one. The probes some records' rank 0
    ran beside its training (``measured.host_probes``) are not a host figure: under ZeRO-3 and
    optimizer offload they read 38-74 us against the run's 15-24 (DeepSpeed's module patches and
    the CPU optimizer's threads), plain ZeRO-0/1 17-20."""
    probes = (rec.get("measured") or {}).get("case_host_probes") or []
    own = [(p or {}).get("hooked_module_us") for p in probes]
    if own and all(own):
        return max(float(v) for v in own if v)
    hooked = ((rec.get("env") or {}).get("host_probe") or {}).get("hooked_module_us")
    return float(hooked) if hooked else None


def _with_host_clock(rec: dict[str, Any]) -> dict[str, Any]:
    hooked = host_probe_us(rec)
    spec = rec.get("spec")
    if not hooked or not isinstance(spec, dict):
        return rec
    hardware = {**spec.get("hardware", {}), "host_clock_factor": host_clock_factor(hooked)}
    return {**rec, "spec": {**spec, "hardware": hardware}}


def plan_records(records: Sequence[dict[str, Any]]) -> list[Row]:
    rows = []
    for rec in records:
        try:
            result: Plan | None = plan(rec["spec"])
            problem = None
        except PlanError as exc:
            result, problem = None, f"planner refused: {exc}"
        rows.append(
            Row(rec.get("case", "?"), rec.get("status", "?"), rec, result, problem, rec.get("_source", ""))
        )
    return rows


def error(planned: float | None, measured: float | None) -> float | None:
    if planned is None or measured is None or measured <= 0:
        return None
    return (planned - measured) / measured


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _group(row: Row, calibrated: set[str]) -> str:
    if row.calibration:
        return "calibration"
    return "measured again" if row.case in calibrated else "held-out"


def split_groups(rows: Sequence[Row]) -> tuple[list[Row], list[Row], list[Row]]:
    """(calibration, held-out, measured again): records of files the constants were fitted on;
    records of other files whose configuration no calibration record has; and records of other
    files that measure a calibration configuration again (repeats, the ten-step re-measurements),
    which test the measurement more than the model."""
    calibrated = _calibrated_cases(rows)
    groups: dict[str, list[Row]] = {"calibration": [], "held-out": [], "measured again": []}
    for r in rows:
        groups[_group(r, calibrated)].append(r)
    return groups["calibration"], groups["held-out"], groups["measured again"]


def _calibrated_cases(rows: Sequence[Row]) -> set[str]:
    return {r.case for r in rows if r.calibration}


def _allocated(p: Plan) -> int:
    g = p.per_gpu
    return max(g.forward_backward_bytes, g.optimizer_step_bytes, g.initialization_bytes)


def _describe(rec: dict[str, Any]) -> str:
    spec = rec["spec"]
    t, r = spec.get("training", {}), spec.get("resources", {})
    offload = "/".join(x for x in (r.get("offload_optimizer"), r.get("offload_param")) if x and x != "none")
    return (
        f"{spec.get('method', 'lora')} z{r.get('zero_stage')} x{r.get('num_gpus')} "
        f"mb{t.get('micro_batch_size')} "
        f"s{t.get('seq_len')}{' ckpt' if t.get('gradient_checkpointing') else ''}"
        f"{' off:' + offload if offload else ''}"
    )


def _memory_table(rows: Sequence[Row]) -> list[str]:
    calibrated = _calibrated_cases(rows)
    out = [
        "| case | group | setup | status | NVML peak GiB | planned GiB | error | torch alloc GiB "
        "| planned alloc GiB | error | step s | planned s | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        p = row.plan
        nvml, alloc, step = (
            row.measured(k) for k in ("nvml_peak_bytes", "torch_max_allocated_bytes", "step_seconds")
        )
        planned = p.per_gpu.total_bytes if p else None
        planned_alloc = _allocated(p) if p else None
        planned_step = p.estimated_step_seconds if p else None
        status = row.status if row.status != "oom" else f"OOM (planned fits={p.fits if p else '?'})"
        limit = (row.record.get("gpu_memory_limit") or {}).get("limit_bytes")
        if limit:  # run with PyTorch's allocator limited to the plan as it stood then
            retries = row.measured("allocator_retries") or 0
            status += f", limited to {limit / GIB:.2f} GiB, {retries:.0f} retries"
        out.append(
            f"| {row.case} | {_group(row, calibrated)} | {_describe(row.record)} | {status} | {_gib(nvml)} | "
            f"{_gib(planned)} | "
            f"{_pct(error(planned, nvml))} | {_gib(alloc)} | {_gib(planned_alloc)} | "
            f"{_pct(error(planned_alloc, alloc))} | {_secs(step)} | {_secs(planned_step)} | "
            f"{_pct(error(planned_step, step))} |"
        )
    return out


def planned_host(p: Plan) -> int:
    """Host bytes as measured: bench/measure.py builds the model on the GPU (or under zero.Init) and
    saves no checkpoint, so neither the plan's model load (a from_pretrained through host memory)
    nor its checkpoint save applies."""
    h = p.host
    resident = (
        h.optimizer_states_bytes
        + h.master_weights_bytes
        + h.gradients_bytes
        + h.parameters_bytes
        + h.pinned_buffers_bytes
    )
    return int(max(h.training_process_bytes + resident,
                   host_staging_peak(p.num_gpus, h.partition_staging_bytes)))


def _host_table(rows: Sequence[Row]) -> list[str]:
    out = [
        "| case | host RSS GiB (all ranks) | planned GiB (model built on GPU) | error "
        "| plan's host.total_bytes GiB |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        if not row.offloaded or row.plan is None or row.status != "ok":
            continue
        rss = row.measured("host_peak_rss_bytes")
        planned = planned_host(row.plan)
        out.append(
            f"| {row.case} | {_gib(rss)} | {_gib(planned)} | {_pct(error(planned, rss))} | "
            f"{_gib(row.plan.host.total_bytes)} |"
        )
    return out


def summary(rows: Sequence[Row]) -> dict[str, list[float]]:
    ok = [r for r in rows if r.status == "ok" and r.plan is not None]
    pairs = {
        "gpu_peak": [error(r.plan.per_gpu.total_bytes, r.measured("nvml_peak_bytes")) for r in ok if r.plan],
        "gpu_allocated": [
            error(_allocated(r.plan), r.measured("torch_max_allocated_bytes")) for r in ok if r.plan
        ],
        "host": [
            error(planned_host(r.plan), r.measured("host_peak_rss_bytes"))
            for r in ok
            if r.plan and r.offloaded
        ],
        "host_zero3": [
            error(planned_host(r.plan), r.measured("host_peak_rss_bytes"))
            for r in ok
            if r.plan and not r.offloaded and r.record["spec"]["resources"].get("zero_stage") == 3
        ],
        "step_time": [error(r.plan.estimated_step_seconds, r.measured("step_seconds")) for r in ok if r.plan],
    }
    return {k: [e for e in v if e is not None] for k, v in pairs.items()}


def calibration(rows: Sequence[Row]) -> list[str]:
    """What the measurements say the named constants should be."""
    ok = [r for r in rows if r.status == "ok" and r.plan is not None]
    outside = [
        n - v
        for r in ok
        if (n := r.measured("nvml_peak_bytes")) is not None and (v := r.measured("torch_max_reserved_bytes"))
    ]
    single = [
        n - v
        for r in ok
        if r.plan
        and r.plan.num_gpus == 1
        and (n := r.measured("nvml_peak_bytes")) is not None
        and (v := r.measured("torch_max_reserved_bytes"))
    ]
    slack = [
        v / a - 1
        for r in ok
        if (v := r.measured("torch_max_reserved_bytes")) and (a := r.measured("torch_max_allocated_bytes"))
    ]
    speed = [r.plan.estimated_step_seconds / s for r in ok if r.plan and (s := r.measured("step_seconds"))]
    lines = []
    if single:
        lines.append(
            "- NVML minus torch reserved, one GPU "
            f"(CUDA_CONTEXT_BYTES = {C.CUDA_CONTEXT_BYTES / GIB:.2f} GiB): "
            f"median {statistics.median(single) / GIB:.2f} GiB"
        )
    if outside:
        lines.append(
            f"- NVML minus torch reserved, all cases: median {statistics.median(outside) / GIB:.2f} GiB"
        )
    multi = [
        n - v
        for r in ok
        if r.plan
        and r.plan.num_gpus > 1
        and (n := r.measured("nvml_peak_bytes")) is not None
        and (v := r.measured("torch_max_reserved_bytes"))
    ]
    if multi:
        lines.append(
            "- NVML minus torch reserved, two or more GPUs "
            f"(CUDA_CONTEXT_BYTES + NCCL_BYTES_PER_GPU = "
            f"{(C.CUDA_CONTEXT_BYTES + C.NCCL_BYTES_PER_GPU) / GIB:.2f} GiB): "
            f"median {statistics.median(multi) / GIB:.2f} GiB"
        )
    if slack:
        lines.append(
            f"- reserved / allocated - 1 (modelled as {C.ALLOCATOR_SLACK_BYTES / GIB:.3f} GiB + "
            f"{C.ALLOCATOR_LOGITS_BLOCKS:g} x one micro-batch's fp32 logits + "
            f"{C.ALLOCATOR_LARGEST_GRADIENT_BLOCKS:g} x the largest trainable tensor's fp32 bytes "
            f"({C.ALLOCATOR_LARGEST_GRADIENT_BLOCKS_OFFLOADED:g} x with the optimizer on NVMe; with it "
            "on the CPU the reduction stream's blocks) + "
            "where ZeRO-3 fetches parameters, "
            f"{C.ALLOCATOR_VOCABULARY_BLOCKS:g} x the embedding's weight bytes under LoRA or "
            f"{C.ALLOCATOR_GATHERED_BLOCKS:g} x the gathered parameters under full fine-tuning + "
            "ZeRO-1/2 buckets the step cannot reuse + "
            f"{C.ALLOCATOR_SOFTCAP_BLOCKS:g} x one micro-batch's fp32 logits where soft-capped "
            f"logits run without checkpointing): median {statistics.median(slack):.3f}"
        )
    if speed:
        lines.append(
            f"- planned / measured step time (MFU = {C.MFU}): median {statistics.median(speed):.2f} "
            "(above 1: the planner is pessimistic)"
        )
    return lines or ["- no successful measurements"]


#: The fitted slack constants, in the order SlackCase.error takes them, with the upper end of the
#: range the fit searches (bytes for the first, multiples of a size for the others).
_SLACK_NAMES = ("ALLOCATOR_SLACK_BYTES", "ALLOCATOR_LOGITS_BLOCKS", "ALLOCATOR_LARGEST_GRADIENT_BLOCKS",
                "ALLOCATOR_LARGEST_GRADIENT_BLOCKS_OFFLOADED", "ALLOCATOR_GATHERED_BLOCKS",
                "ALLOCATOR_VOCABULARY_BLOCKS")
_SLACK_RANGES = (3.0 * GIB, 0.6, 6.0, 6.0, 3.0, 6.0)
Slack = tuple[float, ...]


@dataclass(frozen=True)
class SlackCase:
    """One record's NVML peak as a function of the fitted slack constants:
    planned = max(base + sum(constant x per_unit), floor), the floor being what initialisation
    leaves reserved (0 where it has none)."""

    case: str
    source: str
    base: float
    per_unit: tuple[float, ...]  # the planned total's growth per unit of each constant (bytes: 1)
    measured: float
    floor: float = 0.0

    def error(self, *constants: float) -> float:
        planned = self.base + sum(k * u for k, u in zip(constants, self.per_unit, strict=True))
        return (max(planned, self.floor) - self.measured) / self.measured


def _slack_constants() -> Slack:
    return tuple(float(getattr(C, name)) for name in _SLACK_NAMES)


def slack_cases(rows: Sequence[Row]) -> list[SlackCase]:
    """Re-plan every successful record with the slack constants at 0 and at one unit each."""
    cases = []
    n = len(_SLACK_NAMES)
    units = [tuple(1.0 if i == j else 0.0 for j in range(n)) for i in range(n)]
    for row in rows:
        nvml = row.measured("nvml_peak_bytes")
        if row.status != "ok" or row.plan is None or nvml is None:
            continue
        totals, floor = [], 0.0
        for unit in [(0.0,) * n, *units]:
            with trial(**dict(zip(_SLACK_NAMES, unit, strict=True))):
                g = plan(row.record["spec"]).per_gpu
            steady = max(g.forward_backward_bytes, g.optimizer_step_bytes) + g.allocator_slack_bytes
            totals.append(float(steady + g.cuda_context_bytes))
            if g.total_bytes > totals[-1]:
                floor = float(g.total_bytes)
        base = totals[0]
        per_unit = tuple(t - base for t in totals[1:])
        cases.append(SlackCase(row.case, row.source, base, per_unit, nvml, floor))
    return cases


#: The fit's objective: the median |error|, with a steep penalty below this error (the planner
#: should err high; its safety margin covers over-estimates, not under-estimates).
UNDER_LIMIT = -0.025


def _objective(errors: Any) -> Any:
    """The objective of each row of ``errors`` (one row of per-case errors per candidate)."""
    import numpy as np

    return np.median(np.abs(errors), axis=-1) + 10 * np.clip(UNDER_LIMIT - errors, 0, None).sum(axis=-1)


def _grid_best(cases: Sequence[SlackCase], axes: Sequence[Sequence[float]]) -> Slack:
    """The grid point (one value per constant) with the smallest objective, evaluated in chunks."""
    import numpy as np

    base = np.array([c.base for c in cases])
    units = np.array([c.per_unit for c in cases])  # cases x constants
    measured = np.array([c.measured for c in cases])
    floor = np.array([c.floor for c in cases])
    mesh = np.stack(np.meshgrid(*[np.asarray(a, dtype=float) for a in axes], indexing="ij"), -1)
    points = mesh.reshape(-1, len(axes))
    scores = []
    for start in range(0, len(points), 50_000):
        chunk = points[start : start + 50_000]
        errors = (np.maximum(base + chunk @ units.T, floor) - measured) / measured  # points x cases
        scores.append(_objective(errors))
    return tuple(float(v) for v in points[int(np.argmin(np.concatenate(scores)))])


def _slack_text(values: Slack) -> str:
    return ", ".join(
        f"{name} {v / GIB:.3f} GiB" if name == "ALLOCATOR_SLACK_BYTES" else f"{name} {v:.4g}"
        for name, v in zip(_SLACK_NAMES, values, strict=True)
    )


def fit_slack(cases: Sequence[SlackCase]) -> Slack:
    """The slack constants with the smallest objective: a grid of seven values per constant over
    ``_SLACK_RANGES``, then five times a grid of seven around the best point, each a third as
    wide (final steps: 0.002 GiB and 0.0004-0.004 of a block)."""
    steps = [r / 6 for r in _SLACK_RANGES]
    best = _grid_best(cases, [[i * st for i in range(7)] for st in steps])
    for _ in range(5):
        steps = [st / 3 for st in steps]
        axes = [[max(0.0, v + i * st) for i in range(-3, 4)] for v, st in zip(best, steps, strict=True)]
        best = _grid_best(cases, axes)
    return best


class _FromFile(Protocol):
    @property
    def source(self) -> str: ...


CaseT = TypeVar("CaseT", bound=_FromFile)
FitT = TypeVar("FitT")


def held_out_errors(cases: Sequence[CaseT], fit: Callable[[Sequence[CaseT]], FitT],
                    error: Callable[[CaseT, FitT], float]) -> tuple[list[float], list[float]]:
    """(leave-one-out, leave-one-file-out) errors: each case predicted by ``fit`` on the others,
    and by ``fit`` on the other results files (empty with a single file); both in ``cases`` order."""
    loo = [error(c, fit([*cases[:i], *cases[i + 1 :]])) for i, c in enumerate(cases)]
    return loo, file_out_errors(cases, fit, error)


def file_out_errors(cases: Sequence[CaseT], fit: Callable[[Sequence[CaseT]], FitT],
                    error: Callable[[CaseT, FitT], float]) -> list[float]:
    """Each case predicted by ``fit`` on the other results files, in ``cases`` order (empty with
    a single file)."""
    sources = sorted({c.source for c in cases})
    if len(sources) < 2:
        return []
    out = [0.0] * len(cases)
    for source in sources:
        fitted = fit([c for c in cases if c.source != source])
        for i, c in enumerate(cases):
            if c.source == source:
                out[i] = error(c, fitted)
    return out


def cross_validation(rows: Sequence[Row]) -> list[str]:
    """In-sample, leave-one-out and leave-one-file-out GPU peak errors of the slack fit: what the
    planner can be expected to do on a configuration it has not seen."""
    cases = slack_cases(rows)
    if len(cases) < 3:
        return ["- too few records to cross-validate"]
    fitted = fit_slack(cases)
    in_sample = [c.error(*fitted) for c in cases]
    loo, by_file = held_out_errors(cases, fit_slack, lambda c, k: c.error(*k))
    current = _slack_constants()
    lines = [
        f"- refit on all records: {_slack_text(fitted)} (planner/constants.py: {_slack_text(current)})",
        f"- GPU peak, planner/constants.py: {_stats([c.error(*current) for c in cases])}",
        f"- GPU peak, in-sample refit: {_stats(in_sample)}",
        f"- GPU peak, leave-one-out (each record predicted by constants fitted on the others): {_stats(loo)}",
    ]
    if by_file:
        lines.append(
            "- GPU peak, leave-one-file-out (each results file predicted by constants fitted on the "
            f"other files): {_stats(by_file)}"
        )
    return lines


# --- step time: refit and cross-validation ------------------------------------------------------

#: the fitted step-time constants (MFU is measured: bench/step_kernels.py)
_SPEED_FIELDS = (
    "layer_op_s",
    "zero3_fetch_pass_s",
    "zero3_hook_pass_s",
    "zero3_collective_pass_s",
    "gpu_optimizer_s_per_param",
    "cpu_optimizer_s_per_param_zero3",
    "cpu_optimizer_s_per_param_zero12",
    "clock_overlap",
    "step_tensor_s",
    "host_clock_exponent",
    "clock_overlap_zero12",
)


@dataclass(frozen=True)
class SpeedCase:
    case: str
    source: str
    terms: StepTerms
    measured: float
    #: median (forward and backward, optimizer step) seconds of the steps timed phase by phase
    phases: tuple[float, float] | None = None


def record_setup(spec: dict[str, Any]) -> tuple[Any, Setup]:
    p = prepare(spec)
    t, r = p.spec.training, p.spec.resources
    s = Setup(
        p.spec.method.value,
        int(r.num_gpus),  # type: ignore[arg-type]
        int(r.zero_stage),  # type: ignore[arg-type]
        r.offload_optimizer,  # type: ignore[arg-type]
        r.offload_param,  # type: ignore[arg-type]
        int(t.micro_batch_size),  # type: ignore[arg-type]
        t.gradient_accumulation_steps,
        t.seq_len,
        bool(t.gradient_checkpointing),
        t.precision.value,
        t.optimizer.value,
        attention_for(p.arch, t.attn_implementation),
        p.pinned.knobs,
    )
    return p, s


def speed_cases(rows: Sequence[Row]) -> list[SpeedCase]:
    out = []
    for row in rows:
        measured = row.measured("step_seconds")
        if row.status != "ok" or row.plan is None or measured is None:
            continue
        p, s = record_setup(row.record["spec"])
        out.append(SpeedCase(row.case, row.source, step_terms(p.facts, s, p.rates), measured, _phases(row)))
    return out


def _phases(row: Row) -> tuple[float, float] | None:
    timed = (row.record.get("measured") or {}).get("phase_seconds") or []
    if not timed:
        return None
    passes = statistics.median(p["forward"] + p["backward"] for p in timed)
    step = statistics.median(p["step"] for p in timed)
    return (passes, step) if passes > 0 and step > 0 else None


#: How far (in log space) the step-time fit may move a constant from planner/constants.py: a
#: constant no record of a small file exercises (the CPU optimizer's, without offload) would
#: otherwise drift until its exponential overflows.
_SPEED_LOG_RANGE = 20.0


@lru_cache(maxsize=1)
def _speed_start() -> tuple[float, ...]:
    """planner/constants.py's step-time constants in log space: where the fit starts, and the
    centre of the range it may move in."""
    return tuple(math.log(max(getattr(SpeedConstants(), name), 1e-12)) for name in _SPEED_FIELDS)


def _speed_constants(x: Sequence[float]) -> SpeedConstants:
    low_high = ((s - _SPEED_LOG_RANGE, s + _SPEED_LOG_RANGE) for s in _speed_start())
    values = (math.exp(min(max(v, lo), hi)) for v, (lo, hi) in zip(x, low_high, strict=True))
    return SpeedConstants(**dict(zip(_SPEED_FIELDS, values, strict=True)))


#: The weight of each timed phase's squared log error beside the whole step's, in the step-time fit.
_PHASE_WEIGHT = 0.5


def _speed_loss(x: Sequence[float], cases: Sequence[SpeedCase]) -> float:
    """Squared log errors of the step times, and, where a record timed its phases apart, of its
    forward-and-backward and its optimizer step: which constant a step's time belongs to is then
    seen, not only their sum."""
    k = _speed_constants(x)
    loss = 0.0
    for c in cases:
        passes, step = step_phases(c.terms, k)
        loss += math.log((passes + step) / c.measured) ** 2
        if c.phases:
            loss += _PHASE_WEIGHT * (math.log(passes / c.phases[0]) ** 2 + math.log(step / c.phases[1]) ** 2)
    return loss


def _nelder_mead(f: Any, x0: list[float], iters: int) -> list[float]:
    n = len(x0)
    pts = [list(x0)] + [[v + (0.5 if i == j else 0.0) for j, v in enumerate(x0)] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] < 1e-10:
            break
        cen = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        worst = pts[-1]
        xr = [2 * c - w for c, w in zip(cen, worst, strict=True)]
        fr = f(xr)
        if fr < vals[0]:
            xe = [3 * c - 2 * w for c, w in zip(cen, worst, strict=True)]
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = [(c + w) / 2 for c, w in zip(cen, worst, strict=True)]
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:  # shrink towards the best point
                pts = [pts[0]] + [[(a + b) / 2 for a, b in zip(pts[0], p, strict=True)] for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[min(range(n + 1), key=vals.__getitem__)]


def fit_speed(cases: Sequence[SpeedCase]) -> SpeedConstants:
    """The step-time constants minimising the squared log error (Nelder-Mead in log space, so
    every constant stays positive), started from planner/constants.py and restarted twice."""
    x = list(_speed_start())
    for _ in range(3):
        x = _nelder_mead(lambda v: _speed_loss(v, cases), x, 1500)
    return _speed_constants(x)


def _speed_error(c: SpeedCase, k: SpeedConstants) -> float:
    return step_seconds(c.terms, k) / c.measured - 1


def speed_cross_validation(rows: Sequence[Row]) -> list[str]:
    """In-sample, leave-one-out and leave-one-file-out step-time errors of the speed constants' refit."""
    cases = speed_cases(rows)
    if len(cases) < 8:
        return ["- too few records to cross-validate"]
    fitted = fit_speed(cases)
    in_sample = [_speed_error(c, fitted) for c in cases]
    loo, by_file = held_out_errors(cases, fit_speed, _speed_error)
    current = SpeedConstants()
    refit = ", ".join(f"{n} {getattr(fitted, n):.3g} ({getattr(current, n):.3g})" for n in _SPEED_FIELDS)
    lines = [
        f"- refit on all records (planner/constants.py in brackets): {refit}",
        f"- step time, planner/constants.py: {_stats([_speed_error(c, current) for c in cases])}",
        f"- step time, in-sample refit: {_stats(in_sample)}",
        f"- step time, leave-one-out (each record predicted by the others' fit): {_stats(loo)}",
    ]
    if by_file:
        lines.append(
            "- step time, leave-one-file-out (each results file predicted by constants fitted on the "
            f"other files): {_stats(by_file)}"
        )
    pairs = box_factor_errors(rows)
    if pairs:
        plain, learned = [e for e, _ in pairs], [e for _, e in pairs]
        lines.append(
            "- step time with the box's factor (hardware.step_time_factor: the median measured/planned "
            "ratio of the other records of the same results file, at least three, as the service "
            f"learns it from the box's finished jobs): {_stats(learned)}; within ±25%: "
            f"{sum(abs(e) <= 0.25 for e in learned)} of {len(learned)}, against "
            f"{sum(abs(e) <= 0.25 for e in plain)} without the factor ({_stats(plain)})"
        )
    probed = _host_clock_comparison(cases, by_file)
    if probed:
        lines.append(probed)
    worst = sorted(zip(loo, cases, strict=True), key=lambda ec: -abs(ec[0]))[:4]
    lines.append(
        "- largest leave-one-out errors: " + ", ".join(f"{c.case} {e * 100:+.0f}%" for e, c in worst)
    )
    return lines


def _host_clock_comparison(cases: Sequence[SpeedCase], with_factor: Sequence[float]) -> str | None:
    """Leave-one-file-out step-time errors of the records whose run probed its host, with the
    host-clock factor (hardware.host_clock_factor: ``with_factor``, the cases' own leave-one-file-out
    errors) and with every record taken as the calibration host."""
    probed = [i for i, c in enumerate(cases) if c.terms.host_clock_factor != 1.0]
    if len({cases[i].source for i in probed}) < 2:
        return None
    plain = [replace(c, terms=replace(c.terms, host_clock_factor=1.0)) for c in cases]
    without = file_out_errors(plain, fit_speed, _speed_error)
    return (
        f"- step time of the {len(probed)} records whose run probed its host, leave-one-file-out: with "
        f"the host-clock factor (hardware.host_clock_factor) {_stats([with_factor[i] for i in probed])}; "
        f"every host taken as the calibration host {_stats([without[i] for i in probed])}"
    )


def box_factor_errors(rows: Sequence[Row]) -> list[tuple[float, float]]:
    """(error without, error with) the box's step-time factor for each record whose results file
    (one device session, one box) has at least three other records to learn the factor from."""
    by_source: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        measured = r.measured("step_seconds")
        if r.status == "ok" and r.plan is not None and measured:
            by_source.setdefault(r.source, []).append((r.plan.estimated_step_seconds, measured))
    errors = []
    for pairs in by_source.values():
        for i, (planned, measured) in enumerate(pairs):
            others = [m / p for j, (p, m) in enumerate(pairs) if j != i]
            if len(others) >= 3:
                errors.append((planned / measured - 1, planned * statistics.median(others) / measured - 1))
    return errors


def _environment(records: Sequence[dict[str, Any]]) -> list[str]:
    """One line per box and software stack, with how many records ran on it (a run's other
    environment figures, its host probe among them, do not make a line of their own)."""
    keys = (
        "gpu_name",
        "gpu_memory_bytes",
        "gpu_count",
        "cpu_count",
        "driver",
        "cuda",
        "torch",
        "deepspeed",
        "transformers",
        "peft",
    )
    counts: dict[str, int] = {}
    for r in records:
        env = r.get("env") or {}
        line = ", ".join(f"{k} {env[k]}" for k in keys if env.get(k) is not None)
        counts[line] = counts.get(line, 0) + 1
    return [f"- {line} ({n} record{'' if n == 1 else 's'})" for line, n in sorted(counts.items())]


def _summary_lines(stats: dict[str, list[float]]) -> list[str]:
    return [
        f"- GPU peak (NVML, busiest GPU) vs `per_gpu.total_bytes`: {_stats(stats['gpu_peak'])}",
        f"- torch max allocated vs planned allocated peak: {_stats(stats['gpu_allocated'])}",
        f"- host RSS vs planned host (offload cases): {_stats(stats['host'])}",
        "- host RSS vs planned host (ZeRO-3 without offload: the processes and the partitions' "
        f"staging copy at initialization): {_stats(stats['host_zero3'])}",
        f"- step time vs `estimated_step_seconds`: {_stats(stats['step_time'])}",
    ]


def _spread(values: Sequence[float]) -> float:
    return max(values) / min(values) - 1


def repeats(rows: Sequence[Row]) -> list[str]:
    """The configurations measured more than once: each run's NVML peak, step time and host probe,
    and how far apart the runs of one configuration are (largest over smallest, minus one): what
    no estimator of a single figure per configuration can be closer than."""
    runs: dict[str, list[Row]] = {}
    for row in rows:
        if row.status == "ok" and row.measured("nvml_peak_bytes") and row.measured("step_seconds"):
            runs.setdefault(row.case, []).append(row)
    repeated = {case: rs for case, rs in runs.items() if len(rs) > 1}
    if not repeated:
        return ["- no configuration was measured more than once"]
    lines = ["| case | runs | NVML peak GiB | spread | step s | spread | host probe µs |",
             "|---|---|---|---|---|---|---|"]
    peak_spreads, step_spreads, from_median, planned = [], [], [], []
    for case, rs in sorted(repeated.items()):
        peaks = [r.measured("nvml_peak_bytes") or 0.0 for r in rs]
        steps = [r.measured("step_seconds") or 0.0 for r in rs]
        probes = [host_probe_us(r.record) for r in rs]
        peak_spreads.append(_spread(peaks))
        step_spreads.append(_spread(steps))
        middle = statistics.median(steps)
        from_median += [middle / v - 1 for v in steps]
        planned += [r.plan.estimated_step_seconds / v - 1 for r, v in zip(rs, steps, strict=True) if r.plan]
        lines.append(
            f"| {case} | {', '.join(r.source for r in rs)} | "
            f"{', '.join(_gib(v) for v in peaks)} | {peak_spreads[-1] * 100:.1f}% | "
            f"{', '.join(_secs(v) for v in steps)} | {step_spreads[-1] * 100:.1f}% | "
            f"{', '.join('-' if v is None else f'{v:.1f}' for v in probes)} |"
        )
    return [
        f"- {len(repeated)} configurations measured more than once: NVML peak spread median "
        f"{statistics.median(peak_spreads) * 100:.1f}%, largest {max(peak_spreads) * 100:.1f}%; step time "
        f"spread median {statistics.median(step_spreads) * 100:.1f}%, largest {max(step_spreads) * 100:.1f}%",
        "- an estimator that knew each of these configurations' median measured step time, planning it "
        f"for every run of it: {_stats(from_median)}; within ±25%: "
        f"{sum(abs(e) <= 0.25 for e in from_median)} of {len(from_median)}; the planner on the same "
        f"runs: {_stats(planned)}; within ±25%: {sum(abs(e) <= 0.25 for e in planned)} of {len(planned)}",
        "",
        *lines,
    ]


#: Measured optimizer steps from which a record's step time counts as steady (``ten_steps``).
STEADY_STEPS = 8


def ten_steps(rows: Sequence[Row]) -> list[str]:
    """Step time of the records measured over at least ``STEADY_STEPS`` optimizer steps: how far
    one step is from the next within a run, how far the host probe moved from case to case, and
    the planned step time against the median with the case's own host probe, with the run's probe
    and with no probe (the calibration host)."""
    steady = [r for r in rows if r.status == "ok" and r.plan is not None
              and len(r.measured_list("step_seconds_all")) >= STEADY_STEPS and r.measured("step_seconds")]
    if not steady:
        return ["- no record measured that many steps"]
    spreads = [_spread(r.measured_list("step_seconds_all")) for r in steady]
    probed = (host_probe_us(r.record) for r in steady if r.record["measured"].get("case_host_probes"))
    own = [us for us in probed if us is not None]
    lines = [
        f"- {len(steady)} records measured over {STEADY_STEPS} or more optimizer steps: one step to "
        f"the next within a run (largest over smallest, minus one) median {statistics.median(spreads):.0%}, "
        f"largest {max(spreads):.0%}",
    ]
    if own:
        lines.append(f"- the case's own host probe (slowest rank) read {min(own):.1f}-{max(own):.1f} µs "
                     f"over {len(own)} cases")
    # each row's plan already has the case's own probe (load_records); the others are planned again
    variants: tuple[tuple[str, Callable[[Row], Plan]], ...] = (
        ("the case's own host probe", lambda r: r.plan or plan(r.record["spec"])),
        ("the run's host probe", lambda r: plan(_without_case_probes(r.record)["spec"])),
        ("no probe (the calibration host)", lambda r: plan(_without_probes(r.record)["spec"])))
    for label, planned_for in variants:
        errors = []
        for r in steady:
            planned = planned_for(r).estimated_step_seconds
            errors.append(planned / (r.measured("step_seconds") or 1.0) - 1)
        lines.append(f"- planned against measured, with {label}: {_stats(errors)}; within ±25%: "
                     f"{sum(abs(e) <= 0.25 for e in errors)} of {len(errors)}")
    return lines


def _without_case_probes(rec: dict[str, Any]) -> dict[str, Any]:
    measured = {k: v for k, v in rec["measured"].items() if k != "case_host_probes"}
    return _with_host_clock(_without_probes({**rec, "measured": measured}))


def _without_probes(rec: dict[str, Any]) -> dict[str, Any]:
    spec = rec["spec"]
    hardware = {k: v for k, v in spec.get("hardware", {}).items() if k != "host_clock_factor"}
    return {**rec, "spec": {**spec, "hardware": hardware}}


_SLACK_CV_HEADING = "## Cross-validation of the allocator-slack fit"


def harness_observations(rows: Sequence[Row]) -> list[Observation]:
    calibrated = _calibrated_cases(rows)
    return [observation("harness", _group(r, calibrated), r.plan, nvml) for r in rows
            if r.status == "ok" and r.plan is not None and (nvml := r.measured("nvml_peak_bytes"))]


def service_sections(rows: Sequence[Row], reports: Sequence[Path]) -> list[str]:
    """The service's own jobs, the breakdown per family, method, stage, offload and GPUs, and the
    anchors, over the harness's records and the service's jobs together."""
    service = service_observations(reports)
    every = [*harness_observations(rows), *service]
    return [
        "## The service's own jobs",
        "`bench/field_cases.py` runs jobs through `tunebox serve`, trained by the service's own trainer "
        "on the plan's own DeepSpeed config (`docs/field-cases.md`); each is planned again with the "
        "configuration, box, rows and attention it ran. In-sample: the jobs of the files, or the jobs, a "
        "constant or a structural term of `planner/data/calibration.json` was built on "
        "(`Calibration.shaping_records`); held-out: the rest. Reports: "
        + ", ".join(f"`{_display(p)}`" for p in reports) + ".",
        *service_hardware(reports),
        "",
        *service_section(service),
        "",
        "## GPU peak by family, method, ZeRO stage, offload and GPUs",
        "The harness's records and the service's jobs together; errors against NVML's peak.",
        "",
        *breakdown_section(every),
        "",
        "## Anchors on the same records",
        "What a user could have asked instead, against the same NVML peaks: DeepSpeed's own estimator of "
        "the model states (`estimate_zero2_model_states_mem_needs` for ZeRO 0-2, "
        "`estimate_zero3_model_states_mem_needs` for ZeRO-3; every parameter trained, no activations, no "
        "CUDA context) and accelerate's rule (`accelerate estimate-memory`, \"Training using Adam\": 8 "
        "bytes a parameter in bf16). Neither knows LoRA, QLoRA or activations; both are what their tools "
        "print for the model and configuration.",
        "",
        *anchors_section(every),
        "",
    ]


def render(rows: Sequence[Row], sources: Sequence[Path], reports: Sequence[Path] = ()) -> str:
    stats = summary(rows)
    oom = [r for r in rows if r.status == "oom"]
    missed = [r.case for r in oom if r.plan is not None and r.plan.fits]
    refused = [f"{r.case}: {r.problem}" for r in rows if r.problem]
    errored = [f"{r.case}: {(r.record.get('error') or '')[:120]}" for r in rows if r.status == "error"]
    calib, held, again = split_groups(rows)
    lines = [
        "# Planner accuracy against measurements",
        "",
        "Generated by `bench/accuracy.py` from "
        + ", ".join(f"`{_display(p)}`" for p in sources)
        + ". Errors are (planned - measured) / measured; negative = under-estimate.",
        "",
        "## Hardware and versions",
        *_environment([r.record for r in rows]),
        "",
        "Command: `.venv/bin/python bench/accuracy.py --out docs/accuracy.md`.",
        "",
        "## Calibration and held-out records",
        "The named constants of `planner/constants.py` were fitted on the records of "
        + ", ".join(f"`{name}`" for name in C.CALIBRATION_RESULTS)
        + " (`CALIBRATION_RESULTS`); every other results file is held-out: it tests the model "
        "and was not used to build it. A record of such a file whose configuration a calibration "
        "record has is counted apart, as measured again.",
        "",
        "## Summary: all records",
        *_summary_lines(stats),
        f"- OOM cases: {len(oom)}; planned to fit although they OOMed: {', '.join(missed) or 'none'}",
        "",
        f"## Summary: calibration records ({len(calib)})",
        *_summary_lines(summary(calib)),
        "",
        f"## Summary: held-out records ({len(held)})",
        *(_summary_lines(summary(held)) if held else ["- none yet: new results files land here"]),
        "",
        f"## Summary: calibration configurations measured again by other files ({len(again)})",
        *(_summary_lines(summary(again)) if again else ["- none"]),
        "",
        *(service_sections(rows, reports) if reports else []),
        "## Step time over ten steps",
        *ten_steps(rows),
        "",
        _SLACK_CV_HEADING,
        "The six slack constants are the only fitted part of the GPU peak; everything else is "
        "arithmetic on the model and DeepSpeed's buffers. Each record is predicted by constants "
        "fitted on all records, by constants fitted without it, and by constants fitted without its "
        "results file (each file is one device session: the closest to a new configuration on a new "
        "machine):",
        *cross_validation(rows),
        "",
        "## Cross-validation of the step-time fit",
        "A micro-step is the power mean (sum of t^(1/q))^q of the GPU clock (matmul FLOPs / (rate x MFU), "
        "the memory-bound kernels' bytes / bandwidth and masked attention at its kernel's rate, MFU and "
        "the bytes measured kernel by kernel: bench/step_kernels.py), "
        "the host clock (per-layer costs, ZeRO-3's per-module hook costs, a gathered module's "
        "collective latency over several GPUs, times the host-clock factor where the run probed its "
        "host) and, with overlap_comm, the collectives and offload traffic; the optimizer step adds "
        "per-parameter GPU or CPU time, a host walk over the trainable tensors and the PCIe/NVLink "
        "bytes (planner/speed.py); ZeRO-1/2 with overlap_comm take their own q. "
        f"{len(_SPEED_FIELDS)} constants are fitted; each record is predicted by constants "
        "fitted on all records, by constants fitted without it, and by constants fitted without its "
        "results file:",
        *speed_cross_validation(rows),
        "",
        "## Repeated configurations",
        *repeats(rows),
        "",
        "## Calibration of the named constants",
        *calibration(rows),
        "",
        "How the estimator got here: [accuracy-history.md](accuracy-history.md).",
        "",
        "## GPU memory and step time per case",
        *_memory_table(rows),
        "",
        "## Host memory, offload cases",
        *_host_table(rows),
    ]
    if refused or errored:
        lines += ["", "## Not compared", *(f"- {x}" for x in refused + errored)]
    return "\n".join(lines) + "\n"




def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "results", nargs="*", type=Path, help="JSON-lines files (default: bench/results/*.jsonl)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "accuracy.md")
    parser.add_argument("--refit-speed", action="store_true",
                        help="print the step-time constants fitted on the calibration records, and stop")
    args = parser.parse_args(argv)
    sources = args.results or sorted((ROOT / "bench" / "results").glob("*.jsonl"))
    if not sources:
        print("no measurement records: run bench/measure.py on a GPU first", file=sys.stderr)
        return 1
    rows = plan_records(load_records(sources))
    if args.refit_speed:
        cases = speed_cases(split_groups(rows)[0])
        fitted, current = fit_speed(cases), SpeedConstants()
        for name in _SPEED_FIELDS:
            print(f"{name} {getattr(fitted, name):.4g} (now {getattr(current, name):.4g})")
        now = _stats([_speed_error(c, current) for c in cases])
        print(f"{len(cases)} calibration records: step time now {now}; "
              f"refit {_stats([_speed_error(c, fitted) for c in cases])}")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = render(rows, sources, report_files())
    args.out.write_text(text, encoding="utf-8")
    calib, held, again = split_groups(rows)
    for group, members in (("calibration", calib), ("held-out", held), ("measured again", again)):
        for name, errors in summary(members).items():
            print(f"{group} {name}: {_stats(errors)}")
    # the slack's cross-validation as the report gives it (its refits are the slow part: not twice)
    section = text.partition(f"\n{_SLACK_CV_HEADING}\n")[2].partition("\n## ")[0]
    for line in section.splitlines():
        if line.startswith("- "):
            print("cross-validation " + line.removeprefix("- "))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
