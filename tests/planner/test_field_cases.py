"""The jobs the whole service ran on a GPU (bench/field_cases.py) are tests of the plan.

Each record is a job submitted through ``tunebox serve`` and trained by the service's own trainer;
its NVML peak and the worker's host RSS are the truth. The job is planned again here with the
configuration it ran (the plan's ``resolved`` pinned) on the box it ran on (the per-card limit, if
the phase set one), and the plan must hold the planner's targets: per-GPU peak from -3% to +10% of
NVML's, host RAM within 10% (the worker's peak RSS of the whole run: the model load, the steps with
what is offloaded, the checkpoint saves); and the step time within 25% of the
trainer's own (the median wall time of a step after two warm-up steps; in reports from before that
field, the full rows' tokens over the median real tokens/s) for every job that had its card alone. Known
misses are data (``known_misses.json`` beside the records), each a strict xfail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.field_cases import SHARED_PHASES, measured_jobs, measured_step_seconds, replan

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "field-cases"
GPU_BOUNDS = (-0.03, 0.10)
HOST_BOUND = 0.10
STEP_BOUND = 0.25
GIB = 2**30

JOBS = measured_jobs([p for p in RESULTS.glob("*.json") if p.name != "known_misses.json"])
MISSES = {(m["job"], m["metric"]): m
          for m in json.loads((RESULTS / "known_misses.json").read_text())["misses"]}


def _params(metric: str) -> list[Any]:
    params = []
    for ident, job, box in JOBS:
        miss = MISSES.get((ident, metric))
        marks = [pytest.mark.xfail(strict=True, reason=miss["why"])] if miss else []
        params.append(pytest.param(job, box, id=ident, marks=marks))
    return params


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def test_the_records_cover_what_the_service_ran() -> None:
    assert len(JOBS) >= 10
    assert {j["plan"]["resolved"]["method"] for _, j, _ in JOBS} >= {"lora", "qlora", "full"}
    assert any(box["gpu_memory_bytes"] <= 10 * GIB for _, _, box in JOBS)  # the field report's card


@pytest.mark.parametrize(("job", "box"), _params("gpu"))
def test_the_planned_gpu_peak_holds_what_nvml_saw(job: dict[str, Any], box: dict[str, Any],
                                                  models: Path) -> None:
    planned = replan(job, box, models)
    measured = job["nvml_peak_bytes"]
    error = (planned.per_gpu.total_bytes - measured) / measured
    assert GPU_BOUNDS[0] <= error <= GPU_BOUNDS[1], (
        f"planned {planned.per_gpu.total_bytes / GIB:.2f} GiB, NVML {measured / GIB:.2f} GiB ({error:+.1%})")
    assert planned.fits  # each of these jobs ran on the box it is planned for


@pytest.mark.parametrize(("job", "box"), [p for p in _params("host") if p.values[0]["status"] == "succeeded"])
def test_the_planned_host_memory_holds_what_the_worker_saw(
        job: dict[str, Any], box: dict[str, Any], models: Path) -> None:
    planned = replan(job, box, models).host.total_bytes
    measured = job["measured_host_rss_bytes"]
    error = (planned - measured) / measured
    assert abs(error) <= HOST_BOUND, f"planned {planned / GIB:.2f} GiB, measured {measured / GIB:.2f} GiB"


@pytest.mark.parametrize(("job", "box"), [
    p for p in _params("step") if p.values[0].get("steady_tokens_per_second")
    and p.id.split(":")[1] not in SHARED_PHASES])
def test_the_planned_step_time_holds_what_the_trainer_measured(job: dict[str, Any], box: dict[str, Any],
                                                               models: Path) -> None:
    planned = replan(job, box, models)
    measured = measured_step_seconds(job)
    assert measured is not None
    error = (planned.estimated_step_seconds - measured) / measured
    assert abs(error) <= STEP_BOUND, (
        f"planned {planned.estimated_step_seconds:.3f} s, measured {measured:.3f} s ({error:+.1%})")
