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
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``planner`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import Plan, PlanError, plan  # noqa: E402
from planner import constants as C  # noqa: E402

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

    @property
    def offloaded(self) -> bool:
        res = self.record["spec"].get("resources", {})
        return "cpu" in (res.get("offload_optimizer"), res.get("offload_param")) or "nvme" in (
            res.get("offload_optimizer"),
            res.get("offload_param"),
        )


def load_records(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Records of every file, each tagged with its file's name under ``_source``."""
    records = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                records.append({**json.loads(line), "_source": path.name})
    return records


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


def _group(row: Row) -> str:
    return "calibration" if row.calibration else "held-out"


def _allocated(p: Plan) -> int:
    return max(p.per_gpu.forward_backward_bytes, p.per_gpu.optimizer_step_bytes)


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
        out.append(
            f"| {row.case} | {_group(row)} | {_describe(row.record)} | {status} | {_gib(nvml)} | "
            f"{_gib(planned)} | "
            f"{_pct(error(planned, nvml))} | {_gib(alloc)} | {_gib(planned_alloc)} | "
            f"{_pct(error(planned_alloc, alloc))} | {_secs(step)} | {_secs(planned_step)} | "
            f"{_pct(error(planned_step, step))} |"
        )
    return out


def planned_host(p: Plan) -> int:
    """Host bytes as measured: bench/measure.py builds the model on the GPU (or under zero.Init),
    so the plan's model-load term — a from_pretrained through host memory — does not apply."""
    h = p.host
    return h.process_bytes + (
        h.optimizer_states_bytes
        + h.master_weights_bytes
        + h.gradients_bytes
        + h.parameters_bytes
        + h.pinned_buffers_bytes
    )


def _host_table(rows: Sequence[Row]) -> list[str]:
    out = [
        "| case | host RSS GiB (all ranks) | planned GiB (model built on GPU) | error "
        "| plan's host.total_bytes GiB |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        if not row.offloaded or row.plan is None:
            continue
        rss = row.measured("host_peak_rss_bytes")
        planned = planned_host(row.plan)
        out.append(
            f"| {row.case} | {_gib(rss)} | {_gib(planned)} | {_pct(error(planned, rss))} | "
            f"{_gib(row.plan.host.total_bytes)} |"
        )
    return out


def _stats(errors: Sequence[float]) -> str:
    if not errors:
        return "no data"
    worst_under = min(errors)
    return (
        f"median |error| {statistics.median(abs(e) for e in errors) * 100:.1f}%, worst under-estimate "
        f"{min(0.0, worst_under) * 100:+.1f}%, worst over-estimate {max(0.0, max(errors)) * 100:+.1f}% "
        f"({len(errors)} cases)"
    )


def summary(rows: Sequence[Row]) -> dict[str, list[float]]:
    ok = [r for r in rows if r.status == "ok" and r.plan is not None]
    pairs = {
        "gpu_peak": [error(r.plan.per_gpu.total_bytes, r.measured("nvml_peak_bytes")) for r in ok if r.plan],
        "gpu_allocated": [
            error(_allocated(r.plan), r.measured("torch_max_allocated_bytes")) for r in ok if r.plan
        ],
        "host": [
            error(r.plan.host.total_bytes, r.measured("host_peak_rss_bytes"))
            for r in ok
            if r.plan and r.offloaded
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
    if slack:
        lines.append(
            f"- reserved / allocated - 1 (modelled as {C.ALLOCATOR_SLACK_FRACTION} x allocated + "
            f"{C.ALLOCATOR_SLACK_BYTES / GIB:.2f} GiB + {C.ALLOCATOR_LARGEST_GRADIENT_BLOCKS:g} x the "
            f"largest trainable tensor's bf16 bytes): median {statistics.median(slack):.3f}"
        )
    if speed:
        lines.append(
            f"- planned / measured step time (MFU = {C.MFU}): median {statistics.median(speed):.2f} "
            "(above 1: the planner is pessimistic)"
        )
    return lines or ["- no successful measurements"]


def _environment(records: Sequence[dict[str, Any]]) -> list[str]:
    envs = {json.dumps(r.get("env") or {}, sort_keys=True) for r in records}
    lines = []
    for env_json in sorted(envs):
        env = json.loads(env_json)
        keys = (
            "gpu_name",
            "gpu_memory_bytes",
            "gpu_count",
            "driver",
            "cuda",
            "torch",
            "deepspeed",
            "transformers",
            "peft",
        )
        lines.append("- " + ", ".join(f"{k} {env[k]}" for k in keys if env.get(k) is not None))
    return lines


def _summary_lines(stats: dict[str, list[float]]) -> list[str]:
    return [
        f"- GPU peak (NVML, busiest GPU) vs `per_gpu.total_bytes`: {_stats(stats['gpu_peak'])}",
        f"- torch max allocated vs planned allocated peak: {_stats(stats['gpu_allocated'])}",
        f"- host RSS vs planned host (offload cases): {_stats(stats['host'])}",
        f"- step time vs `estimated_step_seconds`: {_stats(stats['step_time'])}",
    ]


def render(rows: Sequence[Row], sources: Sequence[Path]) -> str:
    stats = summary(rows)
    oom = [r for r in rows if r.status == "oom"]
    missed = [r.case for r in oom if r.plan is not None and r.plan.fits]
    refused = [f"{r.case}: {r.problem}" for r in rows if r.problem]
    errored = [f"{r.case}: {(r.record.get('error') or '')[:120]}" for r in rows if r.status == "error"]
    calib = [r for r in rows if r.calibration]
    held = [r for r in rows if not r.calibration]
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
        "and was not used to build it.",
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
        "## Calibration of the named constants",
        *calibration(rows),
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
    args = parser.parse_args(argv)
    sources = args.results or sorted((ROOT / "bench" / "results").glob("*.jsonl"))
    if not sources:
        print("no measurement records: run bench/measure.py on a GPU first", file=sys.stderr)
        return 1
    rows = plan_records(load_records(sources))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(rows, sources), encoding="utf-8")
    for group, members in (
        ("calibration", [r for r in rows if r.calibration]),
        ("held-out", [r for r in rows if not r.calibration]),
    ):
        for name, errors in summary(members).items():
            print(f"{group} {name}: {_stats(errors)}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
