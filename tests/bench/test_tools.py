"""The GPU-only measurement scripts' parts that run anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

import planner
from bench import eval_memory, pcie, profile_step
from bench.cases import MODELS


def test_eval_memory_compares_against_the_plans_eval_section_for_the_same_job() -> None:
    figures = eval_memory.planned("qwen2.5-1.5b", 8, 2048, 64)
    spec = {"model": {"config": MODELS["qwen2.5-1.5b"]}, "method": "full",
            "training": {"micro_batch_size": 1, "seq_len": 2048},
            "eval": {"batch_size": 8, "max_new_tokens": 64},
            "hardware": {"gpu_count": 1, "gpu_memory_bytes": 143771 * 2**20,
                         "host_memory_bytes": 512 * 2**30}}
    direct = planner.plan(spec).eval
    assert figures["total_bytes"] == direct.total_bytes and figures["logits_bytes"] == direct.logits_bytes
    assert set(figures) >= {"weights_bytes", "kv_cache_bytes", "logits_bytes", "total_bytes"}


TINY_QWEN = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512,
             "tie_word_embeddings": True}


@pytest.mark.slow
def test_eval_memory_runs_the_evaluators_own_steps_on_a_saved_checkpoint(tmp_path: Path) -> None:
    """On the CPU: the model is saved and loaded back as a checkpoint, the split read, the loss and
    the answers computed by worker.evaluate's own functions (no allocator figures here)."""
    rec = eval_memory.measure("tiny", 2, 64, 8, tmp_path, config=TINY_QWEN)
    assert rec["evaluator"] == "worker.evaluate"
    assert (tmp_path / "job" / "run.json").is_file() and (tmp_path / "job" / "eval_split.jsonl").is_file()
    assert rec["samples"] == 2 and 0 < rec["generated"] <= 8
    # one batch of two rows cut to 64 tokens, the prompt's tokens carrying no loss
    assert 0 < rec["target_tokens"] < 2 * 64
    assert 3.0 < rec["loss_per_token"] < 9.0  # ~ln(512) for a random model
    assert list(rec["phases"]) == ["weights", "eval_loss", "generate"]
    assert rec["nvml_peak_bytes"] is None and rec["planned"]["total_bytes"] > 0
    assert rec["attn_implementation"] == "sdpa"


def test_profile_step_needs_a_configuration_and_reads_each_case() -> None:
    with pytest.raises(SystemExit):
        profile_step.main([])
    with pytest.raises(SystemExit):  # an unknown model is refused before anything is built
        profile_step.main(["no-such-model", "lora"])
    plain = ("gemma-2-2b", "full", 1024, 2, True, None)
    assert profile_step._parse_case("gemma-2-2b:full:1024:2:ckpt") == plain
    assert profile_step._parse_case("llama-3.2-3b:lora:2048:1:nockpt:z2")[4:] == (False, 2)


def test_pcie_refuses_a_box_without_a_cuda_gpu() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this box has a CUDA GPU")
    with pytest.raises(SystemExit, match="CUDA"):
        pcie.measure(16)


def test_the_host_clock_track_summary_is_the_correlation_of_its_rounds() -> None:
    """bench/host_clock_track.py: Pearson's r of log step against log probe, recomputed from the
    rounds of a committed record, is the summary it wrote; exact series give +1 and -1."""
    import json
    import math

    from bench.host_clock_track import correlation, summary

    assert correlation([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert correlation([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert correlation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None
    assert correlation([1.0, 2.0], [1.0, 2.0]) is None
    for box in ("", "-box2"):  # two H100 boxes, the same case
        path = (Path(__file__).resolve().parents[2] / "bench" / "results" / "host-clock"
                / f"nvidia-h100-2026-12-06-track-qwen0.5b-z3{box}.jsonl")
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        rounds, written = lines[:-1], lines[-1]["summary"]
        assert len(rounds) == written["rounds"] == 12
        assert summary(rounds) == written
        steps = [math.log(r["step_seconds"]) for r in rounds]
        probes = [math.log(r["probe"]["hooked_module_us"]) for r in rounds]
        assert abs(correlation(probes, steps) or 0.0) < 0.2  # the probe did not follow this host-bound step
