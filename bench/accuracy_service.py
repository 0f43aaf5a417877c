"""The service's own jobs and two anchors, as sections of ``bench/accuracy.py``'s report.

The jobs ``bench/field_cases.py`` ran through ``tunebox serve`` are planned again (``replan``: the
configuration each ran, its box, its rows and attention) and compared with what the trainer and the
worker measured. A job is in-sample where the file or the job itself is named by a constant or a
structural term of ``planner/data/calibration.json`` (``Calibration.shaping_records``), held out
otherwise.

The anchors are what a user could have asked instead of tunebox, on the same records: DeepSpeed's own
estimator of model states (``estimate_zero2_model_states_mem_needs`` for ZeRO 0-2,
``estimate_zero3_model_states_mem_needs`` for ZeRO-3; every parameter counted as trained, no
activations) and accelerate's rule (``accelerate estimate-memory``'s "Training using Adam": 8 bytes a
parameter in bf16, 16 in fp32, for one GPU).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner import Plan

ROOT = Path(__file__).resolve().parent.parent
FIELD_CASES = ROOT / "bench" / "results" / "field-cases"
#: issue 20's targets on the GPU peak
PEAK_BOUNDS = (-0.03, 0.10)
STEP_BOUND = 0.25


@dataclass(frozen=True)
class Observation:
    """One measured job or case against its plan and the anchors (errors: (planned - measured) / measured)."""

    source: str  # "harness" (bench/measure.py) or "service" (bench/field_cases.py)
    group: str  # "calibration", "held-out" or "measured again"
    family: str
    method: str
    zero_stage: int
    offload: str  # "none", "optimizer" or "optimizer+parameters"
    num_gpus: int
    gpu: float
    deepspeed: float
    accelerate: float
    host: float | None = None
    step: float | None = None
    #: the step as the service planned it: with the host-clock factor of the box's probe where the
    #: job's plan recorded one (else as ``step``)
    service_step: float | None = None


def _error(planned: float, measured: float) -> float:
    return (planned - measured) / measured


def deepspeed_estimate(p: Plan) -> int:
    """Bytes a GPU holds for model states by DeepSpeed's own estimator, for the plan's configuration."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    r, m = p.resolved, p.model
    params = m.num_parameters
    if r.zero_stage == 3:
        largest = max(m.vocab_size * m.hidden_size, m.hidden_size * m.intermediate_size)
        _, gpu, _ = estimate_zero3_model_states_mem_needs(
            params, largest, num_gpus_per_node=r.num_gpus, cpu_offload=r.offload_optimizer != "none",
            cpu_offload_params=r.offload_param != "none")
        return int(gpu)
    _, gpu = estimate_zero2_model_states_mem_needs(params, num_gpus_per_node=r.num_gpus,
                                                   cpu_offload=r.offload_optimizer != "none")
    return int(gpu)


def accelerate_estimate(p: Plan) -> int:
    """``accelerate estimate-memory``'s "Training using Adam": the largest of its model, gradient,
    optimizer and step sizes, which is twice the fp32 model for bf16/fp16 and four times for fp32."""
    fp32 = 4 * p.model.num_parameters
    return 4 * fp32 if p.resolved.precision == "fp32" else 2 * fp32


def _offload(optimizer: str, param: str) -> str:
    if param != "none":
        return "optimizer+parameters"
    return "optimizer" if optimizer != "none" else "none"


def observation(source: str, group: str, p: Plan, nvml: float, **extra: Any) -> Observation:
    r = p.resolved
    return Observation(source=source, group=group, family=p.model.model_type, method=r.method,
                       zero_stage=r.zero_stage, offload=_offload(r.offload_optimizer, r.offload_param),
                       num_gpus=r.num_gpus, gpu=_error(p.per_gpu.total_bytes, nvml),
                       deepspeed=_error(deepspeed_estimate(p), nvml),
                       accelerate=_error(accelerate_estimate(p), nvml), **extra)


# --------------------------------------------------------------------------- the service's jobs


def service_group(ident: str, shaping: frozenset[str]) -> str:
    """``calibration`` where the job's file or the job itself shaped the planner, else ``held-out``."""
    from bench.field_cases import record_names

    return "calibration" if record_names(ident) & shaping else "held-out"


def service_observations(paths: Iterable[Path] | None = None) -> list[Observation]:
    from bench.field_cases import SHARED_PHASES, measured_jobs, measured_step_seconds, replan
    from planner.calibration import CALIBRATION

    files = sorted(paths) if paths is not None else report_files()
    shaping = CALIBRATION.shaping_records()
    out = []
    with tempfile.TemporaryDirectory() as where:
        for ident, job, box in measured_jobs(files):
            p = replan(job, box, Path(where))
            r = p.resolved
            host = None
            if job.get("status") == "succeeded" and job.get("measured_host_rss_bytes") and (
                    r.offload_optimizer != "none" or r.method == "qlora"):
                host = _error(p.host.total_bytes, job["measured_host_rss_bytes"])
            step = measured_step_seconds(job)
            alone = ident.split(":")[1] not in SHARED_PHASES
            steps: dict[str, float | None] = {"step": None, "service_step": None}
            if step and alone:
                steps["step"] = steps["service_step"] = _error(p.estimated_step_seconds, step)
                if factor := job["plan"].get("host_clock_factor"):
                    probed = replan(job, {**box, "host_clock_factor": factor}, Path(where))
                    steps["service_step"] = _error(probed.estimated_step_seconds, step)
            out.append(observation("service", service_group(ident, shaping), p, job["nvml_peak_bytes"],
                                   host=host, **steps))
    return out


def report_files() -> list[Path]:
    return sorted(p for p in FIELD_CASES.glob("*.json") if p.name != "known_misses.json")


def service_hardware(paths: Iterable[Path]) -> list[str]:
    """One line per box and software stack the reports ran on, with how many reports."""
    keys = ("gpu_name", "gpu_memory_bytes", "gpu_count", "cpu_count", "driver", "torch", "transformers",
            "peft", "deepspeed", "bitsandbytes")
    counts: dict[str, int] = {}
    for path in paths:
        hw = json.loads(path.read_text()).get("hardware") or {}
        line = ", ".join(f"{k} {hw[k]}" for k in keys if hw.get(k) is not None)
        counts[line] = counts.get(line, 0) + 1
    return [f"- {line} ({n} report{'' if n == 1 else 's'})" for line, n in sorted(counts.items())]


# --------------------------------------------------------------------------- statistics and tables


def stats(errors: Sequence[float]) -> str:
    if not errors:
        return "no data"
    return (f"median |error| {statistics.median(abs(e) for e in errors) * 100:.1f}%, worst under-estimate "
            f"{min(0.0, min(errors)) * 100:+.1f}%, worst over-estimate {max(0.0, max(errors)) * 100:+.1f}% "
            f"({len(errors)} cases)")


def _within(errors: Sequence[float], low: float, high: float) -> str:
    inside = sum(1 for e in errors if low <= e <= high)
    return f"{inside} of {len(errors)}"


def service_section(obs: Sequence[Observation]) -> list[str]:
    lines = []
    for group in ("calibration", "held-out"):
        members = [o for o in obs if o.group == group]
        steps = [o.step for o in members if o.step is not None]
        probed = [o.service_step for o in members if o.service_step is not None]
        hosts = [o.host for o in members if o.host is not None]
        lines += [
            f"- {group} jobs ({len(members)}): GPU peak (NVML) vs `per_gpu.total_bytes`: "
            f"{stats([o.gpu for o in members])}; within -3%/+10%: "
            f"{_within([o.gpu for o in members], *PEAK_BOUNDS)}",
            f"  - host RSS vs `host.total_bytes` (offload and QLoRA): {stats(hosts)}",
            f"  - step time vs `estimated_step_seconds` (alone on the card, the calibration host's clock): "
            f"{stats(steps)}; within ±25%: {_within(steps, -STEP_BOUND, STEP_BOUND)}",
            f"  - the same, as the service planned it (with its box's host-clock factor where the job's plan "
            f"recorded one, {sum(1 for o in members if o.service_step != o.step)} jobs): {stats(probed)}; "
            f"within ±25%: {_within(probed, -STEP_BOUND, STEP_BOUND)}",
        ]
    return lines


DIMENSIONS: tuple[tuple[str, Callable[[Observation], str]], ...] = (
    ("family", lambda o: o.family),
    ("method", lambda o: o.method),
    ("ZeRO stage", lambda o: str(o.zero_stage)),
    ("offload", lambda o: o.offload),
    ("GPUs", lambda o: str(o.num_gpus)),
)


def _cells(errors: Sequence[float]) -> str:
    if not errors:
        return "0 | - | - | -"
    return (f"{len(errors)} | {statistics.median(abs(e) for e in errors) * 100:.1f}% | "
            f"{min(0.0, min(errors)) * 100:+.1f}% | {max(0.0, max(errors)) * 100:+.1f}%")


def breakdown_section(obs: Sequence[Observation]) -> list[str]:
    """GPU peak errors per family, method, ZeRO stage, offload and GPU count: held-out records
    (harness and service) beside every record."""
    lines = ["| by | value | held-out n | median abs | worst under | worst over | all n | median abs "
             "| worst under | worst over |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, key in DIMENSIONS:
        for value in sorted({key(o) for o in obs}):
            members = [o for o in obs if key(o) == value]
            held = [o.gpu for o in members if o.group == "held-out"]
            lines.append(f"| {name} | {value} | {_cells(held)} | {_cells([o.gpu for o in members])} |")
    return lines


def anchors_section(obs: Sequence[Observation]) -> list[str]:
    lines = ["| records | estimator | median abs | worst under | worst over | within -3%/+10% |",
             "|---|---|---|---|---|---|"]
    for source in ("harness", "service"):
        members = [o for o in obs if o.source == source]
        for label, field in (("tunebox", "gpu"), ("DeepSpeed's estimator", "deepspeed"),
                             ("accelerate's rule", "accelerate")):
            errors = [float(getattr(o, field)) for o in members]
            if not errors:
                continue
            lines.append(f"| {source} ({len(errors)}) | {label} | "
                         f"{statistics.median(abs(e) for e in errors) * 100:.1f}% | "
                         f"{min(errors) * 100:+.1f}% | {max(errors) * 100:+.1f}% | "
                         f"{_within(errors, *PEAK_BOUNDS)} |")
    return lines
