"""End to end on the CPU: the harness trains a tiny ZeRO-3 + CPU-offload case in a fresh process,
records it, records a crashing case as an error without stopping, and --resume skips both."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.measure import build_ds_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
              "max_position_embeddings": 256, "tie_word_embeddings": True}


def _tiny_case(name: str, config: dict[str, Any]) -> dict[str, Any]:
    spec = {
        "name": name, "model": {"config": config}, "method": "full",
        "training": {"max_steps": 4, "micro_batch_size": 2, "gradient_accumulation_steps": 2, "seq_len": 32,
                     "gradient_checkpointing": True, "precision": "bf16", "optimizer": "adamw"},
        "resources": {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "none",
                      "deepspeed": {"stage3_param_persistence_threshold": 0}},
        "hardware": {"gpu_count": 1, "gpu_memory_bytes": 2**30, "host_memory_bytes": 8 * 2**30},
    }
    return {"name": name, "spec": spec, "est_seconds": 60, "measured_steps": 2}


def _harness(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    return subprocess.run([sys.executable, "-m", "bench.measure", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("bench")
    broken = copy.deepcopy(TINY_LLAMA)
    broken["model_type"] = "no-such-architecture"
    cases = [_tiny_case("crashes", broken), _tiny_case("tiny|full|z3|off=opt|ckpt|s32|mb2|g2", TINY_LLAMA)]
    (tmp / "cases.json").write_text(json.dumps(cases))
    out = tmp / "out.jsonl"
    t0 = time.monotonic()
    proc = _harness(tmp, "--cases-file", str(tmp / "cases.json"), "--out", str(out),
                    "--budget-seconds", "540", "--work-dir", str(tmp / "work"))
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return {"tmp": tmp, "out": out, "cases": cases, "proc": proc, "wall": wall,
            "records": {r["case"]: r for r in records}, "lines": len(records)}


def test_tiny_case_records_ok_with_host_figures(run: dict[str, Any]) -> None:
    rec = run["records"]["tiny|full|z3|off=opt|ckpt|s32|mb2|g2"]
    assert rec["status"] == "ok", rec["error"]
    assert rec["error"] is None
    m = rec["measured"]
    assert m["host_peak_rss_bytes"] > 50 * 2**20
    assert m["host_peak_rss_sampled_bytes"] > 50 * 2**20
    (phases,) = m["host_phases"]  # one rank
    assert list(phases) == ["after_init_distributed", "after_model", "after_initialize", "after_warmup",
                            "after_measure"]
    assert all(p["rss_bytes"] > 50 * 2**20 and p["pinned_bytes"] is None for p in phases.values())
    # the offloaded fp32 master and moments are host memory the optimizer's first steps created
    assert phases["after_warmup"]["rss_bytes"] > phases["after_init_distributed"]["rss_bytes"]
    assert m["step_seconds"] > 0
    assert m["tokens_per_second"] == pytest.approx(2 * 32 * 2 / m["step_seconds"])
    assert len(m["step_seconds_all"]) == 2
    # the phase-timed steps after the measured ones: each of accumulation 2, every phase took time
    # and the three together are about one measured step (the synchronisation adds a little)
    assert len(m["phase_seconds"]) == 2
    for split in m["phase_seconds"]:
        assert set(split) == {"forward", "backward", "step"} and min(split.values()) > 0
        assert 0.3 * min(m["step_seconds_all"]) < sum(split.values()) < 5 * max(m["step_seconds_all"])
    # each rank read the host's hooked-module time before DeepSpeed was imported
    (probe,) = m["case_host_probes"]
    assert probe["device"] == "cpu" and 0 < probe["hooked_module_us"] < 10_000
    assert m["partitioned_at_init"] is True  # built under zero.Init, as the ZeRO-3 trainer does
    assert m["attn_implementation"] == "sdpa"  # the spec names none: transformers' pick for llama
    assert m["param_count"] > 0 and m["trainable_param_count"] == m["param_count"]
    assert 3.0 < m["loss"] < 9.0  # ~ln(512) for random tokens on a random model
    for key in ("nvml_peak_bytes", "nvml_device_peak_bytes", "torch_max_allocated_bytes",
                "torch_max_reserved_bytes"):
        assert m[key] is None, key
    assert all(v is None for v in m["phase_peaks"].values())
    # one allocated peak per warm-up micro-step (two warm-up steps of accumulation 2) and per
    # measured step; the CPU has no allocator figures
    steps = m["step_allocated_peaks"]
    assert len(steps["warmup_micro_steps"]) == 4 and len(steps["measured_steps"]) == 2
    assert all(v is None for v in steps["warmup_micro_steps"] + steps["measured_steps"])
    assert rec["wall_seconds"] > 0


def test_record_carries_spec_config_and_env(run: dict[str, Any]) -> None:
    rec = run["records"]["tiny|full|z3|off=opt|ckpt|s32|mb2|g2"]
    case = run["cases"][1]
    assert rec["spec"] == case["spec"]
    assert rec["deepspeed_config"] == build_ds_config(case["spec"])
    assert rec["deepspeed_config"]["zero_optimization"]["stage3_param_persistence_threshold"] == 0
    env = rec["env"]
    assert env["gpu_count"] == 0 and env["gpu_name"] is None
    assert env["torch"] and env["deepspeed"] and env["transformers"] and env["peft"]
    assert env["host_memory_bytes"] > 2**30
    assert env["trainer"] == "worker.train"  # the service's own trainer ran the case
    probe = env["host_probe"]  # measured once per run, in a child, on the training device
    assert probe["device"] == "cpu"
    assert all(probe[k] > 0 for k in ("python_loop_1000_us", "tensor_op_us", "hooked_module_us"))
    # a module call through two Python hooks costs more than one bare tensor op
    assert probe["hooked_module_us"] > probe["tensor_op_us"]
    assert set(rec) == {"case", "spec", "deepspeed_config", "status", "error", "measured", "env",
                        "wall_seconds", "gpu_memory_limit"}
    assert rec["gpu_memory_limit"] == {"mode": "none", "slack_share": 1.0, "limit_bytes": None}


def test_crashing_case_is_an_error_and_the_run_goes_on(run: dict[str, Any]) -> None:
    assert run["lines"] == 2
    rec = run["records"]["crashes"]
    assert rec["status"] == "error"
    assert "no-such-architecture" in rec["error"]
    assert "2 cases to run" in run["proc"].stdout
    assert run["proc"].stdout.count("] ok ") + run["proc"].stdout.count("] error ") == 2


def test_resume_skips_what_is_recorded(run: dict[str, Any]) -> None:
    tmp = run["tmp"]
    proc = _harness(tmp, "--cases-file", str(tmp / "cases.json"), "--out", str(run["out"]), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "0 cases to run (2 already recorded)" in proc.stdout
    assert len(run["out"].read_text().splitlines()) == 2


def test_budget_too_small_skips_without_a_record(run: dict[str, Any]) -> None:
    tmp = run["tmp"]
    out = tmp / "budget.jsonl"
    proc = _harness(tmp, "--cases-file", str(tmp / "cases.json"), "--out", str(out), "--budget-seconds", "1",
                    "--only", "tiny")
    assert proc.returncode == 0, proc.stderr
    assert "skip (est" in proc.stdout
    assert not out.exists()
    print(f"CPU end-to-end harness run: {run['wall']:.0f} s")


def test_case_limit_and_budget_stop_record_timeouts(tmp_path: Path) -> None:
    cases = [_tiny_case("slow-a", TINY_LLAMA), _tiny_case("slow-b", TINY_LLAMA)]
    for c in cases:
        c["est_seconds"] = 1
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    out = tmp_path / "t.jsonl"
    # Neither case can even build its model in 3 s: the first hits its own limit, the second the budget.
    proc = _harness(tmp_path, "--cases-file", str(tmp_path / "cases.json"), "--out", str(out),
                    "--no-prebuild", "--no-probe", "--min-case-timeout", "3", "--timeout-factor", "1",
                    "--budget-seconds", "6")
    assert proc.returncode == 0, proc.stderr
    recs = {r["case"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert recs["slow-a"]["status"] == "timeout" and recs["slow-a"]["error"].startswith("timeout after 3 s")
    assert recs["slow-b"]["status"] == "timeout" and recs["slow-b"]["error"].startswith("budget:")
    assert recs["slow-a"]["measured"] is None  # no rank ran
    from bench.measure import done_cases

    assert done_cases(out) == {"slow-a"}  # a budget stop is run again by --resume
