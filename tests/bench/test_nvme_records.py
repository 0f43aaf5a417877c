"""The NVMe offload jobs the service ran on a GPU (bench/nvme_offload.py) are tests of the plan.

Each job of a report that trained at least one step is planned again by today's planner as it ran
(``bench.nvme_offload.replan``) and held to the planner's targets: host RAM within 10% of the
worker's peak RSS of the whole run, the per-GPU peak from -3% to +10% of NVML's, and the NVMe bytes
within 1% of the largest size the job's own swap folder reached (reports that sampled that folder
alone: they carry ``swap_left_bytes``). The host RSS the trainer reported at each step (the job
logs beside a report) is held to the plan's training figure (the process after its first steps and
what stays resident: offloaded states, pinned buffers), without the load and the saves. Known
misses are data (``known_misses.json`` beside the reports), each a strict xfail.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from bench.nvme_offload import replan
from bench.service_gpu import archived_progress

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "nvme-offload"
HOST_BOUND = 0.10
GPU_BOUNDS = (-0.03, 0.10)
NVME_BOUND = 0.01


def _jobs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(RESULTS.glob("*.json")):
        if path.name == "known_misses.json":
            continue
        report = json.loads(path.read_text())
        for pair, sides in report.items():
            if not isinstance(sides, dict):
                continue
            for side, result in sides.items():
                progress = (result.get("job") or {}).get("progress") if isinstance(result, dict) else None
                if progress and (progress.get("step") or 0) >= 1:
                    out.append((f"{path.stem}:{pair}:{side}", result))
    return out


JOBS = _jobs()
MISSES = {(m["job"], m["metric"]): m
          for m in json.loads((RESULTS / "known_misses.json").read_text())["misses"]}


def _params(metric: str) -> list[Any]:
    return [pytest.param(result, id=ident, marks=[pytest.mark.xfail(strict=True, reason=miss["why"])]
                         if (miss := MISSES.get((ident, metric))) else [])
            for ident, result in JOBS if metric != "nvme" or "swap_left_bytes" in result]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def test_the_reports_hold_both_kinds_of_nvme_offload() -> None:
    resources = [r["job"]["spec"]["resources"] for _, r in JOBS]
    offloads = {(res["offload_param"], res["offload_optimizer"]) for res in resources}
    assert {("nvme", "cpu"), ("none", "nvme"), ("cpu", "cpu")} <= offloads
    assert all(ident in {i for i, _ in JOBS} for ident, _ in MISSES)


@pytest.mark.parametrize("result", _params("host"))
def test_the_planned_host_memory_holds_the_runs_peak_rss(result: dict[str, Any], models: Path) -> None:
    measured = result["job"]["progress"]["measured_host_rss_bytes"]
    planned = replan(result, models).host.total_bytes
    assert abs(planned - measured) / measured <= HOST_BOUND, (planned, measured)


def _step_rss(ident: str, result: dict[str, Any]) -> float | None:
    """The median host RSS the job's trainer reported at its steps, from the report's job logs."""
    logs = RESULTS / f"{ident.split(':')[0]}-logs.tgz"
    if not logs.exists():
        return None
    lines = archived_progress(logs).get(result["job"]["id"], [])
    rss = [ln["host_rss_bytes"] for ln in lines if ln.get("type") == "progress" and ln.get("host_rss_bytes")]
    return statistics.median(rss) if rss else None


def _phase_plan(host: Any) -> dict[str, int]:
    """The plan's host figure for the phases of a run that ``bench.nvme_offload.rss_by_phase``
    splits after its load (which ends once deepspeed.initialize has made the offloaded states, so
    no one figure of the plan is its peak)."""
    steps = (host.training_process_bytes + host.master_weights_bytes + host.optimizer_states_bytes
             + host.gradients_bytes + host.parameters_bytes + host.pinned_buffers_bytes)
    return {"first_step": steps + host.first_step_states_bytes, "steps": steps,
            "save": steps + host.checkpoint_save_bytes}


STEP_RSS = [(ident, result, rss) for ident, result in JOBS if (rss := _step_rss(ident, result))]


def test_the_step_rss_is_in_the_job_logs() -> None:
    assert {r["job"]["spec"]["resources"]["offload_optimizer"] for _, r, _ in STEP_RSS} >= {"cpu", "nvme"}


@pytest.mark.parametrize(("result", "rss"), [pytest.param(r, rss, id=i) for i, r, rss in STEP_RSS])
def test_the_planned_training_host_memory_holds_the_steps_rss(result: dict[str, Any], rss: float,
                                                              models: Path) -> None:
    training = _phase_plan(replan(result, models).host)["steps"]
    assert abs(training - rss) / rss <= HOST_BOUND, (training, rss)


@pytest.mark.parametrize("result", _params("gpu"))
def test_the_planned_gpu_peak_holds_what_nvml_saw(result: dict[str, Any], models: Path) -> None:
    measured = result["job"]["progress"]["measured_peak_gpu_bytes"]
    planned = replan(result, models).per_gpu.total_bytes
    assert GPU_BOUNDS[0] <= (planned - measured) / measured <= GPU_BOUNDS[1], (planned, measured)


@pytest.mark.parametrize("result", _params("nvme"))
def test_the_planned_nvme_bytes_are_the_swap_folders_size(result: dict[str, Any], models: Path) -> None:
    measured = result["measured_nvme_bytes"]
    planned = replan(result, models).nvme.total_bytes
    assert abs(planned - measured) <= NVME_BOUND * max(measured, planned), (planned, measured)
    assert result["swap_left_bytes"] == 0  # the worker removed the job's swap files after its run


PHASES = [pytest.param(result, phase, rss, id=f"{ident}:{phase}") for ident, result in JOBS
          for phase, rss in (result.get("host_rss_by_phase") or {}).items() if rss and phase != "load"]


def test_the_phases_are_in_the_reports() -> None:
    sampled = {(p.values[0]["job"]["spec"]["resources"]["offload_optimizer"], p.values[1]) for p in PHASES}
    assert {("nvme", "first_step"), ("nvme", "steps"), ("nvme", "save"), ("cpu", "steps")} <= sampled


@pytest.mark.parametrize(("result", "phase", "rss"), PHASES)
def test_each_phase_of_a_run_holds_its_planned_host_memory(result: dict[str, Any], phase: str, rss: int,
                                                          models: Path) -> None:
    """The largest RSS the bench sampled in a phase of the run (load, first step, steps, save), held
    to the plan's figure for that phase: the first optimizer step of an optimizer on NVMe makes the
    largest sub-group's moments in host memory before it swaps them out."""
    planned = _phase_plan(replan(result, models).host)[phase]
    assert abs(planned - rss) / rss <= HOST_BOUND, (planned, rss)
