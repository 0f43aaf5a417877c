"""bench/field_cases runs a plan's alternatives as jobs: pinning one must give the job that alternative;
a phase's jobs can be run in part (`--only`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cases import MODELS
from bench.field_cases import AUTO, job, pin_alternative
from planner import plan

GIB = 2**30


@pytest.mark.parametrize(("model", "method", "limit_gib"),
                         [("qwen2.5-7b", "lora", 24), ("qwen2.5-7b", "qlora", 10),
                          ("qwen2.5-1.5b", "full", 40)])
def test_a_pinned_alternative_plans_as_that_alternative(model: str, method: str, limit_gib: int) -> None:
    spec = job("j", model, method, AUTO, accumulation=4)
    body = {**{k: v for k, v in spec.items() if k != "name"}, "model": {"config": dict(MODELS[model])},
            "hardware": {"gpu_count": 1, "gpu_memory_bytes": limit_gib * GIB, "host_memory_bytes": 125 * GIB}}
    auto = plan(body).model_dump(mode="json")
    assert len(auto["alternatives"]) >= 2  # a fitting plan or a refusal, each with its alternatives
    for k in (1, 2):
        alternative = auto["alternatives"][k - 1]
        pinned = plan(pin_alternative(body, auto, k))
        assert pinned.fits
        assert pinned.per_gpu.total_bytes == alternative["per_gpu_total_bytes"]
        assert pinned.estimated_tokens_per_second == pytest.approx(alternative["estimated_tokens_per_second"],
                                                                   rel=1e-3)
        assert pinned.per_gpu.total_bytes != auto["per_gpu"]["total_bytes"] or (
            pinned.resolved.model_dump(mode="json") != auto["resolved"])


def test_a_step_is_timed_from_one_progress_record_to_the_next_past_warm_up_and_checkpoints() -> None:
    from bench.service_gpu import steady_step_seconds

    times = {1: 10.0, 2: 11.0, 3: 11.5, 4: 12.0, 5: 14.0, 6: 14.6, 7: 15.2}  # step 5 wrote a checkpoint
    lines = [{"type": "progress", "step": s, "time": t, "tokens_per_second": 1.0} for s, t in times.items()]
    lines.insert(5, {"type": "checkpoint", "step": 5})
    # warm-up (steps 1-2) and the steps beside the checkpoint (5 and 6) are left out: 0.5, 0.5, 0.6
    assert steady_step_seconds(lines, skip=2) == pytest.approx(0.5)
    assert steady_step_seconds(lines[:2], skip=2) is None


def test_a_phase_cut_off_after_its_jobs_ran_is_recovered_from_its_service_folder(tmp_path: Path) -> None:
    """heldout12's bench was stopped while its service shut down; its record was rebuilt from the
    archived folder (``--recover``). Rebuilding it again gives each job as the service stored it."""
    import json
    import tarfile

    from bench.field_cases import PHASES, archive_hardware, recover_phase

    results = Path(__file__).resolve().parents[2] / "bench" / "results" / "field-cases"
    with tarfile.open(results / "nvidia-h100-2026-12-06-heldout12-logs.tgz") as tar:
        tar.extractall(tmp_path / "logs", filter="data")
    archive = tmp_path / "logs" / "tunebox-heldout12"
    work = tmp_path / "work"
    work.mkdir()
    phase = recover_phase("heldout12", archive, 6, work)
    assert sorted(phase["jobs"]) == sorted(j["name"] for j in PHASES["heldout12"][1])
    for record in phase["jobs"].values():
        progress = [json.loads(line) for line in (archive / "jobs" / record["id"] / "progress.jsonl").open()]
        steps = [p for p in progress if p["type"] == "progress"]
        assert record["status"] == "succeeded" and record["steps"] == len(steps) == 6
        assert record["nvml_peak_bytes"] == max(p["nvml_peak_bytes"] for p in steps)
        assert record["plan"]["resolved"]["zero_stage"] == record["spec"]["resources"]["zero_stage"] == 3
    committed = json.loads((results / "nvidia-h100-2026-12-06-heldout12.json").read_text())
    assert json.loads(json.dumps(phase["jobs"], default=str)) == committed["phases"]["heldout12"]["jobs"]
    hardware = archive_hardware(archive, results / "nvidia-h100-2026-12-06-heldout11.json")
    assert hardware["gpu_name"] == "NVIDIA H100 80GB HBM3" and hardware["gpu_memory_bytes"] == 85520809984
    assert hardware == committed["hardware"]


def test_only_keeps_the_named_jobs_of_a_phase_in_its_order_and_refuses_a_name_it_lacks() -> None:
    from bench.field_cases import PHASES, phase_jobs

    names = [j["name"] for j in PHASES["heldout15"][1]]
    limit, jobs = phase_jobs("heldout15", [names[2], names[0]])
    assert (limit, [j["name"] for j in jobs]) == (PHASES["heldout15"][0], [names[0], names[2]])
    assert phase_jobs("heldout15") == PHASES["heldout15"]
    with pytest.raises(SystemExit, match="no job lora-nope"):
        phase_jobs("heldout15", [names[1], "lora-nope"])
