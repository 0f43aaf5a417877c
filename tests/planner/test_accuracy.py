"""bench/accuracy.py on a small fixture of measurement records (synthetic numbers)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

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


def test_a_records_host_clock_is_its_slowest_ranks_own_probe_where_the_case_read_one() -> None:
    """Where each rank probed the host in its own process before the case, the slowest rank's
    reading is the record's host (the ranks wait for each other), not the run's earlier probe."""
    accuracy = _accuracy()
    record = accuracy.load_records([FIXTURE])[0]
    run = {**record, "env": {**record["env"], "host_probe": {"hooked_module_us": 41.2}}}
    own = {**run, "measured": {**run["measured"], "case_host_probes": [{"hooked_module_us": 20.6},
                                                                        {"hooked_module_us": 30.9}]}}
    partial = {**run, "measured": {**run["measured"], "case_host_probes": [{"hooked_module_us": 20.6}, None]}}
    assert accuracy.host_probe_us(own) == 30.9
    assert accuracy.host_probe_us(partial) == 41.2  # a rank without a reading: the run's probe
    assert accuracy._with_host_clock(own)["spec"]["hardware"]["host_clock_factor"] == 1.5


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


def test_repeats_report_what_knowing_each_configurations_median_would_miss() -> None:
    """The floor no planner of one step time per configuration can beat: each run against the
    median of its configuration's runs."""
    accuracy = _accuracy()
    first = next(r for r in accuracy.load_records([FIXTURE]) if r["status"] == "ok")
    t = first["measured"]["step_seconds"]
    runs = [{**first, "_source": f"run-{i}.jsonl", "measured": {**first["measured"], "step_seconds": t * f}}
            for i, f in enumerate((1.0, 1.5, 2.5))]
    lines = accuracy.repeats(accuracy.plan_records(runs))
    (floor,) = [line for line in lines if line.startswith("- an estimator that knew")]
    # the median run is 1.5 t: +50% for the fastest, 0 for itself, -40% for the slowest
    assert "within ±25%: 1 of 3; the planner on the same runs:" in floor
    assert floor.count("(3 cases)") == 2  # the planner is held against the same three runs
    assert "worst under-estimate -40.0%, worst over-estimate +50.0%" in floor


def test_a_calibration_configuration_measured_by_another_file_is_counted_apart() -> None:
    """A record of a file the constants were not fitted on is held-out only when no calibration
    record has its configuration; otherwise it is the same configuration measured again."""
    accuracy = _accuracy()
    first = next(r for r in accuracy.load_records([FIXTURE]) if r["status"] == "ok")
    calibration = {**first, "_source": accuracy.C.CALIBRATION_RESULTS[0]}
    again = {**first, "_source": "again.jsonl"}
    other = {**first, "case": "another|configuration", "_source": "again.jsonl"}
    calib, held, measured_again = accuracy.split_groups(accuracy.plan_records([calibration, again, other]))
    assert [r.case for r in calib] == [first["case"]] and calib[0].source == calibration["_source"]
    assert [r.case for r in held] == ["another|configuration"]
    assert [(r.case, r.source) for r in measured_again] == [(first["case"], "again.jsonl")]


def test_ten_step_records_report_their_spread_and_the_step_time_per_host_reading() -> None:
    """Only records of at least STEADY_STEPS measured steps count; the errors with the case's own
    probe, the run's probe and none follow the host-clock factor each gives the plan."""
    accuracy = _accuracy()
    first = next(r for r in accuracy.load_records([FIXTURE]) if r["status"] == "ok")
    assert accuracy.ten_steps(accuracy.plan_records([first])) == ["- no record measured that many steps"]
    step = first["measured"]["step_seconds"]
    steps = [step * 0.9] * 5 + [step * 1.2] * 5
    rec = {**first, "env": {**first["env"], "host_probe": {"hooked_module_us": 41.2}},
           "measured": {**first["measured"], "step_seconds_all": steps,
                        "case_host_probes": [{"hooked_module_us": 20.6}]}}
    lines = accuracy.ten_steps(accuracy.plan_records([accuracy._with_host_clock(rec)]))
    assert lines[0].startswith("- 1 records measured over 8 or more optimizer steps")
    assert "median 33%" in lines[0]  # 1.2 / 0.9 - 1
    assert lines[1] == "- the case's own host probe (slowest rank) read 20.6-20.6 µs over 1 cases"
    assert [line.split(":")[0] for line in lines[2:]] == [
        "- planned against measured, with the case's own host probe",
        "- planned against measured, with the run's host probe",
        "- planned against measured, with no probe (the calibration host)"]
    # the case's probe reads the calibration host's 20.6 us (factor 1): the same plan as no probe
    assert lines[2].split(": ", 1)[1] == lines[4].split(": ", 1)[1]


def test_the_step_time_fit_keeps_every_constant_finite_and_near_the_planners() -> None:
    """A small file's fit leaves constants its records do not exercise free to drift: they stay
    within e^20 of planner/constants.py instead of overflowing."""
    import math

    accuracy = _accuracy()
    current = accuracy.SpeedConstants()
    wild = accuracy._speed_constants([1e6] * len(accuracy._SPEED_FIELDS))
    tiny = accuracy._speed_constants([-1e6] * len(accuracy._SPEED_FIELDS))
    for name in accuracy._SPEED_FIELDS:
        ratio = getattr(wild, name) / getattr(current, name)
        assert math.isfinite(ratio) and ratio == pytest.approx(math.exp(20), rel=1e-6), name
        assert getattr(tiny, name) / getattr(current, name) == pytest.approx(math.exp(-20), rel=1e-6), name
    start = [math.log(getattr(current, name)) for name in accuracy._SPEED_FIELDS]
    back = accuracy._speed_constants(start)
    assert [getattr(back, n) for n in accuracy._SPEED_FIELDS] == pytest.approx(
        [getattr(current, n) for n in accuracy._SPEED_FIELDS], rel=1e-9)


def test_the_step_time_fit_weighs_the_timed_phases_where_a_record_has_them() -> None:
    """A record that timed its phases apart gives the fit its forward-and-backward and its
    optimizer step besides the whole step (the medians over the timed steps): a plan whose sum is
    right but whose split is wrong costs the fit, and a record without phases costs only its sum."""
    import math

    accuracy = _accuracy()
    record = accuracy.load_records([FIXTURE])[0]
    timed = [{"forward": 0.1, "backward": 0.2, "step": 0.05}, {"forward": 0.1, "backward": 0.4, "step": 0.07},
             {"forward": 0.1, "backward": 0.3, "step": 0.06}]
    phased = {**record, "measured": {**record["measured"], "phase_seconds": timed}}
    plain, with_phases = accuracy.speed_cases(accuracy.plan_records([record, phased]))
    assert plain.phases is None
    assert with_phases.phases == pytest.approx((0.4, 0.06))
    k = accuracy.SpeedConstants()
    passes, step = accuracy.step_phases(with_phases.terms, k)
    x = [math.log(getattr(k, n)) for n in accuracy._SPEED_FIELDS]
    # measured exactly as planned, phase by phase: no loss; the same sum split otherwise: a loss
    exact = accuracy.SpeedCase("x", "a.jsonl", with_phases.terms, passes + step, (passes, step))
    moved = (passes / 2, passes / 2 + step)
    split = accuracy.SpeedCase("x", "a.jsonl", with_phases.terms, passes + step, moved)
    unsplit = accuracy.SpeedCase("x", "a.jsonl", with_phases.terms, passes + step)
    assert accuracy._speed_loss(x, [exact]) == pytest.approx(0.0, abs=1e-12)
    assert accuracy._speed_loss(x, [unsplit]) == pytest.approx(0.0, abs=1e-12)
    assert accuracy._speed_loss(x, [split]) > 0.1


def test_the_hardware_section_gives_each_box_once_with_its_record_count() -> None:
    """Records of one box and stack that differ only in their run's other figures (the host probe)
    share one line; another box (fewer cores) gets its own."""
    accuracy = _accuracy()
    record = accuracy.load_records([FIXTURE])[0]
    env = {**record["env"], "cpu_count": 32}
    runs = [{**record, "env": {**env, "host_probe": {"hooked_module_us": us}}} for us in (15.5, 30.9)]
    other = {**record, "env": {**env, "cpu_count": 16}}
    lines = accuracy._environment([*runs, other])
    assert len(lines) == 2
    assert any("cpu_count 32" in line and line.endswith("(2 records)") for line in lines)
    assert any("cpu_count 16" in line and line.endswith("(1 record)") for line in lines)


def test_main_prints_the_slacks_cross_validation_as_the_report_gives_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accuracy = _accuracy()
    out = tmp_path / "accuracy.md"
    assert accuracy.main([str(FIXTURE), "--out", str(out)]) == 0
    printed = [line.removeprefix("cross-validation ") for line in capsys.readouterr().out.splitlines()
               if line.startswith("cross-validation ")]
    section = out.read_text().split(accuracy._SLACK_CV_HEADING + "\n")[1].split("\n## ")[0]
    assert printed and printed == [line[2:] for line in section.splitlines() if line.startswith("- ")]
