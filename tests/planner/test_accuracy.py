"""bench/accuracy.py on a small fixture of measurement records (synthetic numbers)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from planner import plan

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "measurements.jsonl"


def _accuracy() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_accuracy", ROOT / "bench" / "accuracy.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_accuracy"] = module
    spec.loader.exec_module(module)
    return module


def test_report_compares_each_case(tmp_path: Path) -> None:
    accuracy = _accuracy()
    out = tmp_path / "accuracy.md"
    assert accuracy.main([str(FIXTURE), "--out", str(out)]) == 0
    text = out.read_text()
    for case in ("fixture-lora-z2", "fixture-full-z3-offload", "fixture-full-z0-oom"):
        assert case in text
    assert "OOM (planned fits=False)" in text
    assert "fixture-error: RuntimeError: NCCL timeout" in text
    assert "deepspeed 0.19.8" in text
    record = accuracy.load_records([FIXTURE])[0]
    planned = plan(record["spec"]).per_gpu.total_bytes
    expected = (planned - record["measured"]["nvml_peak_bytes"]) / record["measured"]["nvml_peak_bytes"]
    assert f"{expected * 100:+.1f}%" in text


def test_summary_keeps_host_errors_to_offload_cases() -> None:
    accuracy = _accuracy()
    rows = accuracy.plan_records(accuracy.load_records([FIXTURE]))
    stats = accuracy.summary(rows)
    assert len(stats["gpu_peak"]) == 2 and len(stats["host"]) == 1
    assert any("CUDA_CONTEXT_BYTES" in line for line in accuracy.calibration(rows))


def test_slack_fit_keeps_what_initialisation_reserves_as_a_floor() -> None:
    """A record whose planned peak is what ZeRO-1/2 initialisation leaves reserved does not move
    with the slack constants until the steady peak plus slack passes that floor."""
    accuracy = _accuracy()
    gib = 1024**3
    others = (0.0,) * (len(accuracy._SLACK_NAMES) - 1)
    units = (1.0, *others)
    floored = accuracy.SlackCase("floored", "a.jsonl", 10 * gib, units, 20 * gib, 20 * gib)
    steady = accuracy.SlackCase("steady", "b.jsonl", 10 * gib, units, 12 * gib)
    assert floored.error(0.0, *others) == 0.0
    assert floored.error(12 * gib, *others) == 0.1
    assert steady.error(2 * gib, *others) == 0.0
    # the fit finds the slack that puts the steady record on its measurement; the floored one
    # stays exact on its floor for every slack below 10 GiB
    fitted = accuracy.fit_slack([floored, steady, steady])
    assert abs(fitted[0] - 2 * gib) <= 0.01 * gib
    assert floored.error(*fitted) == 0.0


def test_a_records_host_clock_comes_from_its_runs_probe() -> None:
    """The host-clock factor of a record is its run's probe (a child before the cases); the
    probes beside its own training some records carry do not count."""
    accuracy = _accuracy()
    record = accuracy.load_records([FIXTURE])[0]
    run = {**record, "env": {**record["env"], "host_probe": {"hooked_module_us": 41.2}}}
    beside = {**run, "measured": {**run["measured"],
                                  "host_probes": [{"hooked_module_us": 61.8}, {"hooked_module_us": 103.0}]}}
    assert accuracy.host_probe_us(record) is None
    assert accuracy.host_probe_us(run) == accuracy.host_probe_us(beside) == 41.2
    factors = [accuracy._with_host_clock(r)["spec"].get("hardware", {}).get("host_clock_factor")
               for r in (record, run, beside)]
    assert factors == [None, 2.0, 2.0]


def test_repeats_report_how_far_runs_of_one_configuration_are_apart() -> None:
    accuracy = _accuracy()
    first = next(r for r in accuracy.load_records([FIXTURE]) if r["status"] == "ok")
    m = first["measured"]
    measured = {**m, "nvml_peak_bytes": m["nvml_peak_bytes"] * 1.1, "step_seconds": m["step_seconds"] * 1.5}
    again = {**first, "_source": "again.jsonl", "measured": measured}
    alone = accuracy.repeats(accuracy.plan_records([first]))
    assert alone == ["- no configuration was measured more than once"]
    lines = accuracy.repeats(accuracy.plan_records([first, again]))
    assert lines[0] == ("- 1 configurations measured more than once: NVML peak spread median 10.0%, largest "
                        "10.0%; step time spread median 50.0%, largest 50.0%")
    (row,) = [line for line in lines if line.startswith(f"| {first['case']} |")]
    assert "again.jsonl" in row and "| 10.0% |" in row and "| 50.0% |" in row
