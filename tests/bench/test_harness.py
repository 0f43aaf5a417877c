"""Harness logic that needs no training: selection, --list, --resume bookkeeping, failure triage."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import measure
from bench.cases import CASES


def test_list_filters_by_regex_and_gpu_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert measure.main(["--list", "--only", r"^qwen2\.5-7b\|", "--max-gpus", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = [line.split()[-1] for line in lines[:-1]]
    expected = [c.name for c in CASES if c.name.startswith("qwen2.5-7b|") and c.num_gpus == 1]
    assert names == expected and expected
    assert lines[-1].startswith(f"{len(expected)} cases")


def test_list_includes_two_gpu_cases_when_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    measure.main(["--list", "--max-gpus", "2"])
    out = capsys.readouterr().out
    assert "gpus=2" in out
    assert out.strip().splitlines()[-1].startswith(f"{len(CASES)} cases")


def test_list_runs_as_a_script_too() -> None:
    # The lead may call the file directly; the repo root must then be importable by itself.
    repo = Path(measure.__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "bench/measure.py", "--list", "--only", "llama"], cwd=repo,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "llama-3.2-1b|" in out and "qwen" not in out


def _rec(case: str, status: str, error: str | None = None) -> str:
    return json.dumps({"case": case, "status": status, "error": error})


def test_resume_skips_recorded_cases_but_not_budget_stops(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text("\n".join([
        _rec("a", "ok"), _rec("b", "oom", "CUDA out of memory"), _rec("c", "error", "boom"),
        _rec("d", "timeout", "timeout after 90 s"),
        _rec("e", "timeout", "budget: the wall-clock budget ran out after 12 s"),
        "{not json", ""]) + "\n")
    assert measure.done_cases(out) == {"a", "b", "c", "d"}
    assert measure.done_cases(tmp_path / "missing.jsonl") == set()


def test_list_marks_done_cases_with_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.jsonl"
    first = CASES[0].name
    out.write_text(_rec(first, "ok") + "\n")
    measure.main(["--list", "--resume", "--out", str(out), "--only", "qwen2.5-0.5b"])
    lines = capsys.readouterr().out.splitlines()
    assert any(" done " in line and line.endswith(first) for line in lines)
    assert sum(" done " in line for line in lines) == 1


class _Proc:
    def __init__(self, rc: int) -> None:
        self.returncode = rc


def _runs(tmp_path: Path, codes: list[int], logs: list[str]) -> list[Any]:
    runs = []
    for rank, (rc, text) in enumerate(zip(codes, logs, strict=True)):
        log = tmp_path / f"rank{rank}.log"
        log.write_text(text)
        runs.append(measure.RankRun(rank, _Proc(rc), log, tmp_path / f"rank{rank}.json"))  # type: ignore[arg-type]
    return runs


def test_classify_ok_oom_error_and_timeout(tmp_path: Path) -> None:
    ok = {"status": "ok"}
    runs = _runs(tmp_path, [0, 0], ["", ""])
    assert measure._classify(runs, [ok, ok], False, False, 60) == ("ok", None)
    runs = _runs(tmp_path, [3, -9], ["torch.OutOfMemoryError: CUDA out of memory.", "waiting"])
    status, err = measure._classify(runs, [{"status": "oom"}, None], False, False, 60)
    assert status == "oom" and "CUDA out of memory" in (err or "")
    runs = _runs(tmp_path, [-signal.SIGKILL], ["loading"])
    status, err = measure._classify(runs, [None], False, False, 60)
    assert status == "oom" and (err or "").startswith("host:")
    runs = _runs(tmp_path, [3], ["Traceback\nValueError: bad config"])
    assert measure._classify(runs, [{"status": "error"}], False, False, 60) == (
        "error", "Traceback\nValueError: bad config")
    runs = _runs(tmp_path, [-9], ["step 1"])
    status, err = measure._classify(runs, [None], True, True, 42)
    assert status == "timeout" and (err or "").startswith("budget:")
    assert measure._classify(runs, [None], True, False, 42)[1].startswith("timeout after 42 s")  # type: ignore[union-attr]


def test_children_keep_nvlink_multicast_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = measure._child_env(1, 2, 29555)
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("1", "1", "2", "29555")


def test_ops_prebuilt_are_those_the_cases_need() -> None:
    offload = [c for c in CASES if c.spec["resources"]["offload_optimizer"] == "cpu"][:1]
    plain = [c for c in CASES if c.spec["resources"]["offload_optimizer"] == "none"][:1]
    assert "CPUAdamBuilder" in measure._needed_ops(offload)
    assert "FusedAdamBuilder" not in measure._needed_ops(offload)
    assert "FusedAdamBuilder" in measure._needed_ops(plain)
    assert {"CPUAdamBuilder", "FusedAdamBuilder"} <= set(measure._needed_ops(CASES))


def test_memory_limit_is_the_plans_less_the_slack_given_up() -> None:
    from bench.cases import MATRICES
    from bench.measure import MemoryLimit, parse_args
    from planner import plan

    spec = MATRICES["limit"][0].spec
    per_gpu = plan(spec).per_gpu
    assert MemoryLimit().limit_bytes(spec) is None  # the default measures the natural peak
    assert MemoryLimit("plan").limit_bytes(spec) == per_gpu.allocator_limit_bytes
    assert MemoryLimit("plan", 0.25).limit_bytes(spec) == int(
        per_gpu.allocator_limit_bytes - 0.75 * per_gpu.allocator_slack_bytes)
    assert per_gpu.allocator_limit_bytes == per_gpu.total_bytes - per_gpu.cuda_context_bytes
    for bad in (["--limit-slack-share", "1.5"], ["--limit-slack-share", "0.5"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    assert parse_args(["--gpu-memory-limit", "plan", "--limit-slack-share", "0.5"]).limit_slack_share == 0.5


def test_per_step_allocated_peaks_come_from_the_busiest_rank() -> None:
    quiet = {"warmup_micro_steps": [5, 4], "measured_steps": [4, 4]}
    busy = {"warmup_micro_steps": [9, 6], "measured_steps": [6, 6]}  # its first step peaks highest
    got = [{"rank": 0, "step_allocated_peaks": quiet}, {"rank": 1, "step_allocated_peaks": busy}, {"rank": 2}]
    assert measure._busiest_steps(got) == busy
    assert measure._busiest_steps([{"rank": 0}]) is None
    on_cpu = {"warmup_micro_steps": [None], "measured_steps": [None]}
    assert measure._busiest_steps([{"step_allocated_peaks": on_cpu}]) == on_cpu
